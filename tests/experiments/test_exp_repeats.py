"""Repeats run interleaved and every table shows medians with intervals; a winner is named
only where intervals allow (on simulated time where a test needs planted timings to come out
exactly; the SLO search: test_exp_simulated.py)."""
from __future__ import annotations

import json

import pytest

from experiments.commands.run import run_main
from tests.experiments.exp_util import write_config


def _lines(path):
    return [json.loads(s) for s in path.read_text().splitlines()]


@pytest.mark.slow
def test_repeats_interleave_and_report_medians_with_intervals(tmp_path, exp_model, simulated):
    cfg = write_config(tmp_path / "c.toml", exp_model, """
        engines = ["paced", "paced2"]
        repeats = 2
        cost_per_hour = 2.0
        [engine_options.paced]
        period_ms = 2
        [engine_options.paced2]
        period_ms = 6            # planted: three times the TPOT of paced
        [workload]
        num_requests = 8
        output_len = 16
        [load]
        concurrency = [2]
        warmup = 1
        """)
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    run = tmp_path / "res" / "t"
    first = {}
    for eng in ("paced", "paced2"):
        recs = _lines(run / eng / "requests.jsonl")
        assert sorted({r["repeat"] for r in recs}) == [1, 2] and len(recs) == 16
        for rep in (1, 2):
            first[(eng, rep)] = min(r["send_ns"] for r in recs if r["repeat"] == rep)
        m = json.loads((run / eng / "manifest.json").read_text())
        assert m["status"] == "ok" and set(m["repeats"]) == {"1", "2"}
        assert set(m["levels"]["concurrency=2"]) == {"1", "2"}
    order = sorted(first, key=first.get)
    assert order == [("paced", 1), ("paced2", 1), ("paced", 2), ("paced2", 2)]  # A B A B
    # the copy bandwidth was read before each of the four starts; every engine keeps the best one
    peaks = [json.loads((run / eng / "manifest.json").read_text())["peak_bandwidth"] for eng in ("paced", "paced2")]
    assert peaks[0] == peaks[1] and len(peaks[0]["readings"]) == 4
    assert peaks[0]["cpu_gbps"] == max(peaks[0]["readings"])
    s = json.loads((run / "paced/summary.json").read_text())["levels"]["concurrency=2"]
    assert s["ci_basis"] == "repeats" and s["repeats"] == [1, 2]
    lo, hi = s["ci"]["tpot_ms.median"]
    assert lo <= s["tpot_ms"]["median"] <= hi
    assert s["cost_per_m_output"] == pytest.approx(2.0 / (s["output_throughput"] * 3600) * 1e6, rel=1e-6)
    report = (run / "report.md").read_text()
    assert "median over 2 repeats" in report
    assert "TPOT median (ms): **paced** is better than paced2 (intervals do not overlap)" in report
    row = next(x for x in report.splitlines() if x.startswith("| TPOT median (ms) |"))
    assert row.count("[") == 2  # both engines' cells carry an interval
    assert "cost per million output tokens" in report
    assert "Read before each engine: 4 readings" in report


@pytest.mark.slow
def test_one_run_has_request_intervals_and_no_throughput_ranking(tmp_path, exp_model, simulated):
    cfg = write_config(tmp_path / "c.toml", exp_model, """
        engines = ["paced", "paced2"]
        [engine_options.paced]
        period_ms = 3
        [engine_options.paced2]
        period_ms = 3            # the same engine twice: no significant latency difference
        [workload]
        num_requests = 12
        output_len = 16
        [load]
        concurrency = [2]
        warmup = 1
        """)
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    report = (tmp_path / "res/t/report.md").read_text()
    assert "bootstrap interval over the requests" in report
    assert "TPOT median (ms): no significant difference" in report
    assert "output tokens/s: not ranked (no interval" in report


def test_settings_table_marks_and_flags_a_planted_difference(tmp_path, exp_model, paced):
    cfg = write_config(tmp_path / "c.toml", exp_model, """
        engines = ["paced", "paced2"]
        [engine_options.paced]
        effective = { dtype = "float32", prefix_caching = true, max_num_seqs = 8, sources = { dtype = "/info" } }
        memory = { weights = 104857600, layout_panels = 20971520, kv_allocated = 52428800, activation_peak = 31457280, graph_pool = 10485760, runtime_base = 41943040 }
        [engine_options.paced2]
        effective = { dtype = "float32", prefix_caching = false, max_num_seqs = 8 }
        [workload]
        num_requests = 4
        output_len = 8
        [load]
        concurrency = [2]
        warmup = 0
        """)
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    report = (tmp_path / "res/t/report.md").read_text()
    assert "| prefix caching | yes **≠** | no **≠** |" in report
    assert "| max running sequences | 8 | 8 |" in report  # equal: not marked
    assert "- **settings**: prefix caching differs between engines: paced yes, paced2 no." in report
    assert "| dtype [1] | float32 | float32 |" in report and "- [1] dtype: paced: /info" in report  # a footnote per sourced row
    assert ("| engine | parameters | layout: panels | KV allocated | KV peak used | activations peak | CUDA graph pool | "
            "interpreter and libraries | unaccounted (peak − parts) | peak |") in report
    row = next(x for x in report.splitlines() if x.startswith("| paced | 100.0 | 20.0 | 50.0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5:8] == ["30.0", "10.0", "40.0"]  # activations peak, graph pool, interpreter: as the engine reported
    assert cells[9].endswith("(RSS)")  # peak sampled from the engine's process tree
    peak = float(cells[9].removesuffix(" (RSS)").replace(",", ""))
    assert float(cells[8].replace(",", "")) == pytest.approx(peak - 250.0, abs=0.11)  # every part but the KV in use
    row2 = next(x for x in report.splitlines() if x.startswith("| paced2 |") and "(RSS)" in x)
    cells2 = [c.strip() for c in row2.strip("|").split("|")]
    assert cells2[1:8] == ["–"] * 7  # not exposed: a dash, never a guess
    assert cells2[8] == cells2[9].removesuffix(" (RSS)")  # so the whole peak is unaccounted, and shown as such


def test_a_variant_runs_an_engine_again_with_other_options(tmp_path, exp_model, simulated):
    cfg = write_config(tmp_path / "c.toml", exp_model, """
        engines = ["paced", "paced-slow"]
        [engine_options.paced-slow]
        adapter = "paced"
        period_ms = 8
        [workload]
        num_requests = 4
        output_len = 8
        [load]
        concurrency = [2]
        warmup = 0
        """)
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    fast = json.loads((tmp_path / "res/t/paced/summary.json").read_text())["levels"]["concurrency=2"]
    slow = json.loads((tmp_path / "res/t/paced-slow/summary.json").read_text())["levels"]["concurrency=2"]
    assert slow["tpot_ms"]["median"] == pytest.approx(4 * fast["tpot_ms"]["median"])  # 8 ms vs 2 ms, simulated
    assert "| metric | paced | paced-slow |" in (tmp_path / "res/t/report.md").read_text()
    bad = write_config(tmp_path / "bad.toml", exp_model, 'engines = ["x"]\n[engine_options.x]\nadapter = "nope"\n')
    assert run_main([str(bad)]) == 2
