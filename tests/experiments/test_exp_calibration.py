"""Calibration: the paced engine (a child process) emits events at known perf_counter_ns
times, 500 events/s, multi-token events included; TTFT / ITL / TPOT computed by the
harness must be within 1 ms of the truth taken from the child's own emission stamps.
The split of multi-token events is checked exactly on a hand-made record in test_exp_metrics."""
from __future__ import annotations

import asyncio
import json
import os

import pytest

from tests.experiments.exp_util import write_config
from experiments import metrics
from experiments.commands import run_main
from experiments.load import LoadGenerator, chains
from experiments.results import record
from experiments.workloads import WorkItem
from tests.experiments.paced_engine import PacedEngine

PATTERN = [1, 3, 1, 2]  # tokens per event, cycled: multi-token events every other event
TTFT_MS, PERIOD_MS, OUT = 20.0, 2.0, 40
TOL_MS = 1.0


def sizes(out: int) -> list[int]:
    s, sent, k = [], 0, 0
    while sent < out:
        s.append(min(PATTERN[k % len(PATTERN)], out - sent))
        sent, k = sent + s[-1], k + 1
    return s


def true_row(send_ns: int, truth: list[tuple[int, int, int]]) -> dict:
    """The metrics of one request computed from the engine's emission times."""
    return metrics.per_request({"request_id": "x", "send_ns": send_ns, "events": [[t, n] for t, n, _ in truth],
                                "output_token_ids": [0] * sum(n for _, n, _ in truth), "prompt_token_ids": [1]})


async def drive(items: list[WorkItem], concurrency: int):
    eng = PacedEngine("m", options={"ttft_ms": TTFT_MS, "period_ms": PERIOD_MS, "pattern": PATTERN})
    await eng.start()
    outs = []
    try:
        gen = LoadGenerator(eng, {"temperature": 0.0}, outs.append)
        await gen.closed(chains(items), concurrency)
    finally:
        await eng.stop()
    return eng, outs


def compare(got_rows: list[dict], want_rows: list[dict]) -> None:
    """The harness adds < 1 ms: per request for nearly every request, and in the median and p90
    of every metric. Means and p99 of per-request metrics are not held to 1 ms: on a 2-core
    machine the OS can deschedule the client for tens of milliseconds once in a while, and one
    such request moves them. When the machine is oversubscribed (load average above its core
    count, e.g. other jobs running beside the tests) the OS's wake-up latency alone exceeds
    1 ms, so a miss there is reported as a skip that names the deviation, not as a pass."""
    try:
        _compare(got_rows, want_rows)
    except AssertionError as e:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
        if load > cores:
            pytest.skip(f"machine oversubscribed (load {load:.1f} > {cores} cores): {e}")
        raise


def _compare(got_rows: list[dict], want_rows: list[dict]) -> None:
    close = sum(all(abs(g[k] - w[k]) < TOL_MS for k in ("ttft_ms", "tpot_ms", "e2el_ms"))
                for g, w in zip(got_rows, want_rows))
    assert close >= 0.85 * len(got_rows)
    checks = [(k, s) for k in ("ttft_ms", "tpot_ms", "e2el_ms") for s in ("median", "p90")]
    for key, st in checks + [("itl_ms", s) for s in ("mean", "median", "p90")]:
        def pooled(rows):
            return metrics.stats(v for r in rows for v in (r[key] if key == "itl_ms" else [r[key]]))[st]
        assert abs(pooled(got_rows) - pooled(want_rows)) < TOL_MS, (key, st)


def test_times_match_the_engine_within_1ms():
    """One request at a time at 500 events/s, straight through the load generator. 36 requests,
    so that the 85 % rule tolerates 5 descheduled ones (with 16, three missed it in CI on de6ec3c)."""
    items = [WorkItem(f"r{i}", [5, 6, 7 + i], OUT) for i in range(36)]
    eng, outs = asyncio.run(drive(items, 1))
    assert len(outs) == 36 and all(o.ok for o in outs)
    got_rows, want_rows = [], []
    for o in outs:
        rec = record(o, "concurrency=1", 1)
        truth = eng.truth[o.item.request_id]
        assert [n for _, n in rec["events"]] == sizes(OUT) == [n for _, n, _ in truth]
        got, want = metrics.per_request(rec), true_row(o.send_ns, truth)
        assert got["output_tokens"] == OUT
        # the split: one ITL value per token after the first event = the event's gap / its tokens
        assert len(got["itl_ms"]) == len(want["itl_ms"]) == OUT - sizes(OUT)[0]
        got_rows.append(got)
        want_rows.append(want)
    compare(got_rows, want_rows)


def test_whole_run_matches_the_truth(tmp_path, exp_model, paced):
    """Through `inferlab run` (warm-up, memory sampler, JSONL, summary.json). 36 requests, so
    that the 85 % rule tolerates 5 descheduled ones (with 12, two missed it in CI on e027773)."""
    truth_path, N = tmp_path / "truth.json", 36
    cfg = write_config(tmp_path / "c.toml", exp_model, f"""
        engine = "paced"
        [engine_options.paced]
        ttft_ms = {TTFT_MS}
        period_ms = {PERIOD_MS}
        pattern = {PATTERN}
        truth_path = "{truth_path}"
        [workload]
        num_requests = {N}
        input_len = 16
        output_len = {OUT}
        [load]
        concurrency = [1]
        warmup = 1
    """, name="calib")
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    truth = json.loads(truth_path.read_text())
    recs = [json.loads(s) for s in (tmp_path / "res/calib/paced/requests.jsonl").read_text().splitlines()]
    assert len(recs) == N
    got_rows = [metrics.per_request(r) for r in recs]
    want_rows = [true_row(r["send_ns"], truth[r["request_id"]]) for r in recs]
    compare(got_rows, want_rows)
    s = json.loads((tmp_path / "res/calib/paced/summary.json").read_text())["levels"]["concurrency=1"]
    assert s["num_requests"] == N and s["output_tokens"] == N * OUT
    assert s["token_checks"]["stopped_early"] == 0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):  # summary.json says what per_request says
        pooled = [v for r in got_rows for v in (r[key] if key == "itl_ms" else [r[key]])]
        assert s[key]["median"] == pytest.approx(metrics.stats(pooled)["median"])
