"""The report's memory split on the real reference engine, in-process and as a launched
`inferlab serve`: "KV peak used" is the engine's own peak over the run, read back after the
last level, not the figure read at start (which saw only the start-up warm-up)."""
from __future__ import annotations

import json

import pytest

from experiments.commands.run import run_main
from tests.experiments.exp_util import write_config

CONCURRENCY, PROMPT, OUTPUT, BLOCK = 4, 64, 8, 16


def test_kv_peak_used_is_the_runs_peak_on_both_reference_modes(tmp_path, exp_model):
    cfg = write_config(tmp_path / "c.toml", exp_model, f"""
        engines = ["reference", "served"]
        [engine_options.served]
        adapter = "reference"
        mode = "server"
        [workload]
        num_requests = 8
        input_len = {PROMPT}
        output_len = {OUTPUT}
        [load]
        concurrency = [{CONCURRENCY}]
        warmup = 0
        [kv]
        tokens = 4096
        """)
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    report = (tmp_path / "res/t/report.md").read_text()
    lines = [r for r in report.split("## Memory split")[1].split("\n## ")[0].splitlines() if r.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {r.split("|")[1].strip(): dict(zip(head, (c.strip() for c in r.strip("|").split("|")))) for r in lines[1:]}
    num = lambda cell: float(cell.split(" (")[0].replace(",", ""))  # noqa: E731
    for name in ("reference", "served"):
        m = json.loads((tmp_path / f"res/t/{name}/manifest.json").read_text())
        per_tok, at_start = m["info"]["memory"]["kv_bytes_per_token"], m["info"]["memory"]["kv_peak_used"]
        peak = m["repeats"]["1"]["memory_after"]["kv_peak_used"]
        # four requests in flight at once hold at least their prompts' blocks
        assert peak >= CONCURRENCY * -(-PROMPT // BLOCK) * BLOCK * per_tok > at_start, (name, peak, at_start)
        assert peak <= m["info"]["memory"]["kv_allocated"]
        row, mem = rows[name], m["info"]["memory"]
        assert row["KV peak used"] == f"{peak / 2 ** 20:,.1f}", (name, row)
        layouts = {k.removeprefix("layout_"): v for k, v in mem.items() if k.startswith("layout_")}
        assert {k.removeprefix("layout: ") for k in head if k.startswith("layout: ")} == set(layouts)  # each by name
        assert all(row[f"layout: {k}"] == f"{v / 2 ** 20:,.1f}" for k, v in layouts.items())
        assert row["parameters"] == f"{mem['weights'] / 2 ** 20:,.1f}"
        # CPU: measured, not a dash: the activations' high-water after the run, the RSS before weights
        act = max(r["memory_after"]["activation_peak"] for r in m["repeats"].values())
        assert act > 0 and row["activations peak"] == f"{act / 2 ** 20:,.1f}"
        runtime = mem["runtime_base"] + mem.get("runtime_front", 0)
        assert ("runtime_front" in mem) == (name == "served")  # the server's front end is a process of its own
        assert row["interpreter and libraries"] == f"{runtime / 2 ** 20:,.1f}"
        assert row["peak"].endswith("(RSS)") and row["CUDA graph pool"] == "–"
        parts = mem["weights"] + sum(layouts.values()) + mem["kv_allocated"] + act + runtime
        assert num(row["unaccounted (peak − parts)"]) == pytest.approx(num(row["peak"]) - parts / 2 ** 20, abs=0.11)
    # CPU over the level, per process of the engine (runner.engine_cpu): the launched server's front end and
    # its engine core each did work; the in-process engine's core is a process of the harness's own
    for name, procs_expected in (("reference", 1), ("served", 2)):
        m = json.loads((tmp_path / f"res/t/{name}/manifest.json").read_text())
        procs = next(iter(m["levels"].values()))["1"]["engine_cpu"]
        assert len(procs) == procs_expected and [d["root"] for d in procs].count(True) == 1, (name, procs)
        assert all(d["cpu_s"] > 0 and not d["harness"] for d in procs), (name, procs)
    cpu = report.split("## CPU: the harness")[1].split("\n## ")[0]
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:4]] for r in cpu.splitlines() if r.startswith("| ")}
    assert rows["engine processes"] == ["1", "2"]
    assert all(float(v) > 0 for v in rows["engine process tree: cores busy (CPU s / wall s)"])
