"""The report's memory split on the real reference engine, in-process and as a launched
`inferlab serve`: "KV peak used" is the engine's own peak over the run, read back after the
last level, not the figure read at start (which saw only the start-up warm-up)."""
from __future__ import annotations

import json

from experiments.commands import run_main
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
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")]
            for r in report.split("## Memory split")[1].split("\n## ")[0].splitlines() if r.startswith("| ")}
    for name in ("reference", "served"):
        m = json.loads((tmp_path / f"res/t/{name}/manifest.json").read_text())
        per_tok, at_start = m["info"]["memory"]["kv_bytes_per_token"], m["info"]["memory"]["kv_peak_used"]
        peak = m["repeats"]["1"]["memory_after"]["kv_peak_used"]
        # four requests in flight at once hold at least their prompts' blocks
        assert peak >= CONCURRENCY * -(-PROMPT // BLOCK) * BLOCK * per_tok > at_start, (name, peak, at_start)
        assert peak <= m["info"]["memory"]["kv_allocated"]
        assert rows[name][3] == f"{peak / 2 ** 20:,.1f}", (name, rows[name])  # the KV peak used column
