"""The harness's timing mechanism on simulated time (experiments.running.clock.simulated): the engine
sleeps its planted delays on a loop whose clock jumps, so every time the harness records is
exact on any machine. These replace the wall-clock calibration and SLO-search bounds (those
now run as benchmarks: `make bench`, docs/perf/)."""
from __future__ import annotations

import asyncio
import json

import pytest

from experiments.commands.run import run_main
from experiments.measuring import metrics
from experiments.running import clock
from experiments.running.load import LoadGenerator, chains
from experiments.running.results import record
from experiments.workload.workloads import WorkItem
from tests.experiments.exp_util import write_config
from tests.experiments.sim_engine import SimEngine

PATTERN = [1, 3, 1, 2]  # tokens per event, cycled: multi-token events every other event
TTFT_MS, PERIOD_MS, OUT = 20.0, 2.0, 40


def planted(n_events_tokens: list[int]) -> dict:
    """TTFT, ITL values and TPOT of one request served at once, from the planted schedule."""
    itl = [PERIOD_MS / n for n in n_events_tokens[1:] for _ in range(n)]
    out = sum(n_events_tokens)
    e2el = TTFT_MS + (len(n_events_tokens) - 1) * PERIOD_MS
    return {"ttft_ms": TTFT_MS, "itl_ms": itl, "e2el_ms": e2el, "tpot_ms": (e2el - TTFT_MS) / (out - 1)}


def sizes(out: int) -> list[int]:
    s, sent = [], 0
    while sent < out:
        s.append(min(PATTERN[len(s) % len(PATTERN)], out - sent))
        sent += s[-1]
    return s


def test_the_simulated_loop_jumps_to_each_timer_in_order():
    async def main():
        woke = []

        async def at(d):
            await asyncio.sleep(d)
            woke.append((d, clock.now_ns()))

        await asyncio.gather(*(at(d) for d in (3.0, 0.5, 2.0)))
        await asyncio.to_thread(lambda: None)  # real I/O (a thread's result) still arrives
        return woke

    with clock.simulated():
        woke = clock.run(main())
    assert woke == [(0.5, 500_000_000), (2.0, 2_000_000_000), (3.0, 3_000_000_000)]


def test_closed_loop_records_the_planted_times_exactly(simulated):
    """One request at a time: every request's TTFT, ITL split (a multi-token event's gap shared
    by its tokens) and TPOT equal the planted ones; send and receive stamps come from one clock."""
    items = [WorkItem(f"r{i}", [5, 6, 7 + i], OUT) for i in range(6)]
    eng = SimEngine("m", options={"ttft_ms": TTFT_MS, "period_ms": PERIOD_MS, "pattern": PATTERN})

    async def drive():
        await eng.start()
        outs = []
        await LoadGenerator(eng, {"temperature": 0.0}, outs.append).closed(chains(items), 1)
        return outs

    outs = clock.run(drive())
    want = planted(sizes(OUT))
    assert [o.item.request_id for o in outs] == eng.sent == [it.request_id for it in items]
    for i, o in enumerate(outs):
        got = metrics.per_request(record(o, "concurrency=1", 1))
        assert o.send_ns == i * round(want["e2el_ms"] * 1e6)  # back to back: each sent as the last finished
        assert got["ttft_ms"] == pytest.approx(want["ttft_ms"], abs=1e-6)
        assert got["itl_ms"] == pytest.approx(want["itl_ms"], abs=1e-6)
        assert got["tpot_ms"] == pytest.approx(want["tpot_ms"], abs=1e-6)
        assert got["e2el_ms"] == pytest.approx(want["e2el_ms"], abs=1e-6)


def test_queueing_behind_a_planted_capacity_shows_in_ttft_only(simulated):
    """Capacity 1, four requests at once: request k waits k service times before its first
    token, and its inter-token times are untouched."""
    items = [WorkItem(f"r{i}", [1, 2, i], 10) for i in range(4)]
    eng = SimEngine("m", options={"ttft_ms": 10, "period_ms": 1, "capacity": 1})

    async def drive():
        await eng.start()
        outs = []
        await LoadGenerator(eng, {"temperature": 0.0}, outs.append).open(chains(items), [0.0] * 4)
        return outs

    outs = sorted(clock.run(drive()), key=lambda o: o.item.request_id)
    service = 10 + 9 * 1
    for k, o in enumerate(outs):
        got = metrics.per_request(record(o, "rate=inf", 1))
        assert got["ttft_ms"] == pytest.approx(10 + k * service, abs=1e-6)
        assert got["itl_ms"] == pytest.approx([1.0] * 9, abs=1e-6)


def test_a_whole_run_records_the_truth_and_sends_only_the_workload(tmp_path, exp_model, simulated):
    """Through `inferlab run` (warm-up, memory sampler, observer bracket, JSONL, summary.json):
    the engine receives the warm-up and the measured requests and nothing else, and every
    recorded metric is the planted one."""
    n, warm = 12, 2
    cfg = write_config(tmp_path / "c.toml", exp_model, f"""
        engine = "sim"
        [engine_options.sim]
        ttft_ms = {TTFT_MS}
        period_ms = {PERIOD_MS}
        pattern = {PATTERN}
        [workload]
        num_requests = {n}
        input_len = 16
        output_len = {OUT}
        [load]
        concurrency = [1, 3]
        warmup = {warm}
    """, name="calib")
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    eng = SimEngine.last
    recs = [json.loads(s) for s in (tmp_path / "res/calib/sim/requests.jsonl").read_text().splitlines()]
    measured = [r["request_id"] for r in recs]
    assert len(measured) == 2 * n and len(eng.sent) == 2 * (n + warm)
    assert set(measured) <= set(eng.sent) and len(set(eng.sent) - set(measured)) == warm
    want = planted(sizes(OUT))
    s = json.loads((tmp_path / "res/calib/sim/summary.json").read_text())["levels"]
    for level in ("concurrency=1", "concurrency=3"):
        rows = [metrics.per_request(r) for r in recs if r["level"] == level]
        assert all(r["ttft_ms"] == pytest.approx(TTFT_MS, abs=1e-6) for r in rows)
        assert all(r["itl_ms"] == pytest.approx(want["itl_ms"], abs=1e-6) for r in rows)
        assert s[level]["num_requests"] == n and s[level]["output_tokens"] == n * OUT
        assert s[level]["ttft_ms"]["median"] == pytest.approx(TTFT_MS, abs=1e-6)
        assert s[level]["tpot_ms"]["p90"] == pytest.approx(want["tpot_ms"], abs=1e-6)
    # no queue: three streams at once take the time of one, so throughput triples exactly
    assert s["concurrency=3"]["output_throughput"] == pytest.approx(3 * s["concurrency=1"]["output_throughput"], rel=1e-6)


SEARCH = """
        cost_per_hour = 3.6
        engine = "sim"
        [engine_options.sim]
        ttft_ms = 10
        period_ms = 2
        capacity = 2
        [workload]
        num_requests = 10
        output_len = 20
        [load]
        mode = "search"
        burstiness = 1000
        warmup = 1
        [load.search]
        start_rate = 8
        max_levels = 8
        level_s = {level_s}
        [slo]
        ttft_ms = 30
        """


def _search(tmp_path, exp_model, level_s: float) -> tuple[dict, str]:
    cfg = write_config(tmp_path / "c.toml", exp_model, SEARCH.format(level_s=level_s))
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    found = json.loads((tmp_path / "res/t/sim/manifest.json").read_text())["repeats"]["1"]["search"]
    return found, (tmp_path / "res/t/report.md").read_text()


def test_search_finds_a_planted_saturation_rate(tmp_path, exp_model, simulated):
    """2 servers, each request 10 ms to its first token + 19 x 2 ms: saturation at 2 / 0.048 s
    = 41.67 req/s. Near-regular arrivals form a queue only past it: at rate r each request waits
    24 - 1000 / r ms longer than the one before. Levels last 10 s (r x 10 requests, fresh ones past the
    workload's 10), so past saturation the queue outgrows the 20 ms of TTFT slack (SLO 30 ms) within the
    level: at 42 req/s the 420th request waits 80 ms. 8 levels bracket the planted rate to one bisection
    step: 40 passes, 42 fails."""
    found, report = _search(tmp_path, exp_model, 10)
    best, failing = found["best_rate"], found["failing_rate"]
    assert [p["rate"] for p in found["points"]] == [8, 16, 32, 64, 48, 40, 44, 42]
    assert [p["requests"] for p in found["points"]] == [80, 160, 320, 640, 480, 400, 440, 420]
    assert (best, failing) == (40, 42) and best <= 2 / 0.048 <= failing
    # a level's requests past the workload's 10 are fresh prompts of its kind: none repeats (so none hits
    # a prefix cache), and the workload's own 10 come first
    eng = SimEngine.last
    measured = [pr for r, pr in zip(eng.sent, eng.prompts) if not r.startswith("warmup-")]
    assert len(measured) == sum(p["requests"] for p in found["points"])
    level_40 = measured[80 + 160 + 320 + 640 + 480: 80 + 160 + 320 + 640 + 480 + 400]
    assert len(set(level_40)) == 400 and level_40[:10] == measured[:10]
    assert "Each level sent arrivals for at least 10 s" in report and "## Best load under the SLOs" in report
    at_best = json.loads((tmp_path / "res/t/sim/summary.json").read_text())["levels"][f"rate={best:g}"]
    assert at_best["num_requests"] == 400
    row = next(x for x in report.splitlines() if x.startswith("| sim |") and "95%" in x)
    want = 0.001 / at_best["output_throughput"] * 1e6  # $3.6/h = $0.001/s over output tok/s
    assert float(row.strip("|").split("|")[-1]) == pytest.approx(want, rel=1e-3, abs=5e-4)


def test_a_search_of_short_levels_passes_a_burst_past_saturation(tmp_path, exp_model, simulated):
    """The same engine with level_s = 0: each level is the workload's 10 requests, a burst. At 44 req/s
    the 10th waits 9 x 1.27 = 11 ms, inside the slack, so the search reports a rate the engine cannot
    sustain (41.67): why levels last (experiments/running/search.py)."""
    found, report = _search(tmp_path, exp_model, 0)
    assert all(p["requests"] == 10 for p in found["points"])
    assert found["best_rate"] >= 44 > 2 / 0.048
    assert "a burst" in report
