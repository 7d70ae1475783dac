"""`load.mode = "sweep"` for real: the tiny model behind `inferlab serve`, capped at 1/2/4 users with short
sustained levels (about 30 s in all); and a planted slow client, whose levels are flagged client-bound and
whose stop reason says so. Mechanisms only: no time is bounded here."""
from __future__ import annotations

import csv
import json
import time
from collections import Counter

import pytest

from experiments.commands.run import run_main
from tests.experiments.exp_util import write_config

LEVEL_S = 3.0


def test_the_engines_own_queue_stops_a_sweep_at_its_planted_capacity(tmp_path, exp_model, simulated):
    """Simulated time, exact on any machine: an engine that serves 4 requests at once (the rest queue, as its own
    counter says) is swept 1, 2, 4, 8; at 8 half of each request's time is queueing, so the sweep stops there,
    then refines at the geometric midpoints 6 (the last two levels) and 3 (the largest jump)."""
    cfg = write_config(tmp_path / "cap.toml", exp_model, """
        engine = "paced"
        [engine_options.paced]
        ttft_ms = 20
        period_ms = 2
        capacity = 4
        [workload]
        kind = "random"
        num_requests = 4
        input_len = 8
        output_len = 40
        [load]
        mode = "sweep"
        warmup = 0
        [load.sweep]
        level_s = 2
        refine = 2
    """, name="cap")
    assert run_main([str(cfg), "--out", str(tmp_path / "results"), "--no-progress"]) == 0
    sw = json.loads((tmp_path / "results" / "cap" / "paced" / "manifest.json").read_text())["repeats"]["1"]["sweep"]
    pts = {p["concurrency"]: p for p in sw["points"]}
    assert list(pts) == [1, 2, 4, 8, 6, 3] and sw["refined"] == [6, 3]
    assert all(pts[c]["queue_share"] == 0 for c in (1, 2, 3, 4)) and pts[8]["queue_share"] > 0.4
    assert sw["stopped"].startswith("the engine's own queue held ") and "at concurrency 8" in sw["stopped"]
    # 4 servers of 98 ms each: 4 / 0.098 s = 40.8 requests/s at most, 40 tokens each
    assert pts[4]["throughput"] == pytest.approx(pts[8]["throughput"], rel=0.05)
    assert pts[2]["throughput"] == pytest.approx(2 * pts[1]["throughput"], rel=0.05)


@pytest.mark.slow
def test_a_real_sweep_through_the_server_finds_its_levels_and_draws_the_frontier(tmp_path, tiny_llama):
    cfg = write_config(tmp_path / "sweep.toml", tiny_llama, f"""
        engine = "reference"
        [engine_options.reference]
        mode = "server"
        [workload]
        kind = "random"
        num_requests = 4
        input_len = 32
        output_len = 16
        [load]
        mode = "sweep"
        warmup = 2
        [load.sweep]
        max_concurrency = 4
        level_s = {LEVEL_S}
        refine = 0
        [frontier]
        interactivity = [1, 1000000]
        price_per_device_hour = 0.04
    """, name="sweep")
    assert run_main([str(cfg), "--out", str(tmp_path / "results"), "--no-progress"]) == 0
    run = tmp_path / "results" / "sweep"
    m = json.loads((run / "reference" / "manifest.json").read_text())
    sw = m["repeats"]["1"]["sweep"]
    levels = [p["concurrency"] for p in sw["points"]]
    assert levels[:2] == [1, 2] and all(b == 2 * a for a, b in zip(levels, levels[1:])) and levels[-1] <= 4
    assert sw["stopped"]  # why it stopped is always said
    if levels[-1] == 4:
        assert sw["stopped"].startswith(("the next level (8) would pass max_concurrency = 4", "output throughput grew"))
    recs = [json.loads(line) for line in (run / "reference" / "requests.jsonl").read_text().splitlines()]
    by_level = Counter(r["level"] for r in recs)
    assert set(by_level) == {f"concurrency={c}" for c in levels}
    ids = [r["request_id"] for r in recs]
    assert len(ids) == len(set(ids))  # no request sent twice: no level rides on another's prefix cache
    prompts = [tuple(r["prompt_token_ids"]) for r in recs]
    assert len(prompts) == len(set(prompts))
    for c in levels:  # sustained: the users kept sending fresh requests until level_s had passed
        mine = [r for r in recs if r["level"] == f"concurrency={c}"]
        assert len(mine) > c and max(r["done_ns"] for r in mine) - min(r["send_ns"] for r in mine) >= LEVEL_S * 1e9
        assert all(r["due_ns"] is not None and r["send_ns"] >= r["due_ns"] for r in mine)
    for p in sw["points"]:  # the engine's own counters, read around each level: its queue histogram and preemptions
        assert p["preemptions"] == 0 and p["queue_share"] is not None and 0 <= p["queue_share"] < 1
        assert p["lateness_p99"] is not None
    assert m["devices"]["kind"] == "cpu" and m["devices"]["count"] >= 1 and "affinity mask" in m["devices"]["per"]
    report = (run / "report.md").read_text()
    assert "## The frontier: throughput per device against interactivity" in report
    assert "![frontier](plots/frontier.png)" in report and (run / "plots" / "frontier.png").stat().st_size > 0
    assert "from the per-window throughput inside each sustained level (one run)" in report
    assert "Cost at $0.04 per device-hour (frontier.price_per_device_hour)" in report
    assert "- reference / repeat 1: levels " in report and "stopped: " in report
    assert "| 1 | reference | outside the measured range" in report  # 1 tok/s per user: below every level
    rows = list(csv.DictReader((run / "frontier.csv").open()))
    assert {r["level"] for r in rows} == set(by_level) and any(r["on_frontier"] == "True" for r in rows)
    assert all(float(r["output_ci_lo"]) <= float(r["output_per_device"]) <= float(r["output_ci_hi"]) for r in rows)
    data = json.loads((run / "frontier.json").read_text())
    assert data["price"].startswith("$0.04") and set(data["targets"]) == {"1.0", "1000000.0"}
    # predicted first: `inferlab simulate` runs the same sweep in simulated time (a shipped spec profile here),
    # and `inferlab report MEASURED SIMULATED` draws both frontiers on one page, the prediction labelled
    from experiments.commands.report import main as report_main
    from experiments.simulate.cli import main as simulate_main

    assert simulate_main([str(cfg), "--profile", "h200", "--out", str(tmp_path / "sim")]) == 0
    sim = tmp_path / "sim" / "sweep-simulated"
    assert json.loads((sim / "reference-simulated" / "manifest.json").read_text())["repeats"]["1"]["sweep"]["stopped"]
    assert report_main([str(run), str(sim), "--out", str(tmp_path / "overlay")]) == 0
    both = {r["engine"] for r in csv.DictReader((tmp_path / "overlay" / "frontier.csv").open())}
    assert both == {"reference", "reference-simulated"}
    overlay = (tmp_path / "overlay" / "report.md").read_text()
    assert "**Simulated, not measured: reference-simulated**" in overlay and "(uncalibrated)" in overlay


def test_a_slow_client_is_flagged_and_never_passes_for_saturation(tmp_path, exp_model, paced, monkeypatch):
    """The client takes 40 ms over each finished request (planted: its record-keeping sleeps), so each user's
    next request goes out ~40 ms after it was due; every level is client-bound, and the stop reason says so."""
    from experiments.running import runner

    real = runner.record

    def slow(*a, **kw):
        time.sleep(0.04)
        return real(*a, **kw)

    monkeypatch.setattr(runner, "record", slow)
    cfg = write_config(tmp_path / "slow.toml", exp_model, """
        engine = "paced"
        [engine_options.paced]
        ttft_ms = 5
        period_ms = 1
        [workload]
        kind = "random"
        num_requests = 4
        input_len = 8
        output_len = 4
        [load]
        mode = "sweep"
        warmup = 0
        [load.sweep]
        max_concurrency = 2
        level_s = 0.5
        refine = 0
        client_lateness_ms = 25
    """, name="slow")
    assert run_main([str(cfg), "--out", str(tmp_path / "results"), "--no-progress"]) == 0
    m = json.loads((tmp_path / "results" / "slow" / "paced" / "manifest.json").read_text())
    sw = m["repeats"]["1"]["sweep"]
    assert [p["concurrency"] for p in sw["points"]] == [1, 2]
    assert all(p["client_bound"] and p["lateness_p99"] >= 30 for p in sw["points"]), sw["points"]
    assert sw["stopped"].startswith("the next level (4) would pass max_concurrency = 2")
    assert "client-bound (send lateness p99" in sw["stopped"]
    report = (tmp_path / "results" / "slow" / "report.md").read_text()
    assert "**client-bound levels: concurrency=1, concurrency=2**" in report


def test_a_matrix_sweeps_every_cell_into_one_frontier_and_report_rebuilds_it(tmp_path, exp_model, simulated):
    """Simulated time: cell `fast` decodes at 1 ms a token but stops at 2 users, cell `wide` at 2 ms but goes to 8.
    One engine, one frontier across both cells: fast's 2 users (the most interactive) and wide's 8 (the most
    throughput), everything else dominated; read between them at a target; the matrix root rebuilds from its
    folders (`inferlab report ROOT`)."""
    from experiments.commands.report import main as report_main

    cfg = write_config(tmp_path / "mx.toml", exp_model, """
        engine = "paced"
        [engine_options.paced]
        ttft_ms = 10
        [workload]
        kind = "random"
        num_requests = 4
        input_len = 8
        output_len = 41
        [load]
        mode = "sweep"
        warmup = 0
        [load.sweep]
        level_s = 1
        refine = 0
        [frontier]
        interactivity = [750]
        [[cells]]
        name = "fast"
        engine_options = { paced = { period_ms = 1 } }
        load = { sweep = { max_concurrency = 2 } }
        [[cells]]
        name = "wide"
        engine_options = { paced = { period_ms = 2 } }
        load = { sweep = { max_concurrency = 8 } }
    """, name="mx")
    assert run_main([str(cfg), "--out", str(tmp_path / "results"), "--no-progress"]) == 0
    root = tmp_path / "results" / "mx"
    rows = list(csv.DictReader((root / "frontier.csv").open()))
    on = {(r["cell"], r["level"]) for r in rows if r["on_frontier"] == "True"}
    assert on == {("fast", "concurrency=2"), ("wide", "concurrency=8")}, rows
    x = {(r["cell"], r["level"]): float(r["interactivity"]) for r in rows}
    assert x[("fast", "concurrency=2")] == pytest.approx(1000) and x[("wide", "concurrency=8")] == pytest.approx(500)
    page = (root / "report.md").read_text()
    assert "## The frontier: throughput per device against interactivity" in page
    assert "fast/concurrency=2 .. wide/concurrency=8" not in page  # ascending interactivity: wide, then fast
    assert "| 750 | paced | " in page and "wide/concurrency=8 .. fast/concurrency=2" in page
    assert "- paced / fast / repeat 1: levels 1, 2; stopped: the next level (4) would pass max_concurrency = 2" in page
    (root / "report.md").unlink()
    assert report_main([str(root)]) == 0 and "`inferlab report " in (root / "report.md").read_text()
