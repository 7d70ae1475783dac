"""The harness path in simulated time (replay.py, served.py): exact predicted times on a workload
small enough to compute by hand, through the same runner and records as `inferlab run`."""
from __future__ import annotations

import json

import pytest

from experiments.measuring import metrics
from experiments.simulate.replay import replay
from experiments.workload.config import load
from tests.experiments.exp_util import write_config
from tests.experiments.simulate.planted import PER_SEQ, PER_STEP, planted

BODY = """
engine = "reference"
[workload]
kind = "random"
num_requests = 3
input_len = 32
output_len = 4
[load]
mode = "closed"
concurrency = [1, 2]
warmup = 0
[kv]
tokens = 1024
"""


def rows(run_dir, level):
    recs = [json.loads(ln) for ln in (run_dir / "reference-simulated" / "requests.jsonl").read_text().splitlines()]
    return [metrics.per_request(r) for r in recs if r["level"] == level]


def test_closed_loop_times_are_the_planted_step_costs(exp_model, tmp_path):
    """One at a time: a prefill step then 3 decode steps of one sequence, 11 ms each. Two at a time:
    the first two share every step (12 ms), the third runs alone once they finish."""
    path = write_config(tmp_path / "c.toml", exp_model, BODY)
    run = replay(load(path), path.read_text(), planted(), tmp_path / "out")
    one, two = PER_STEP + PER_SEQ, PER_STEP + 2 * PER_SEQ
    for r in rows(run, "concurrency=1"):
        assert r["ttft_ms"] == pytest.approx(one * 1e3, abs=1e-6)
        assert r["e2el_ms"] == pytest.approx(4 * one * 1e3, abs=1e-6)
        assert r["tpot_ms"] == pytest.approx(one * 1e3, abs=1e-6)
    got = sorted((round(r["ttft_ms"], 6), round(r["e2el_ms"], 6)) for r in rows(run, "concurrency=2"))
    assert got == sorted([(round(two * 1e3, 6), round(4 * two * 1e3, 6))] * 2 + [(round(one * 1e3, 6),
                                                                                 round(4 * one * 1e3, 6))])
    m = json.loads((run / "reference-simulated" / "manifest.json").read_text())
    assert m["simulated"]["engine"] == "reference" and m["info"]["mode"] == "simulated"
    assert "Simulated, not measured" in (run / "report.md").read_text()


def test_chunked_prefill_spends_the_token_budget_per_step(exp_model, tmp_path):
    """A 40-token prompt under a 16-token budget: 3 prefill steps (16, 16, 8) before the first token."""
    path = write_config(tmp_path / "c.toml", exp_model, BODY.replace("input_len = 32", "input_len = 40")
                        .replace("concurrency = [1, 2]", "concurrency = [1]")
                        + '[engine_options.reference]\nmax_num_batched_tokens = 16\n')
    run = replay(load(path), path.read_text(), planted(), tmp_path / "out")
    one = PER_STEP + PER_SEQ
    for r in rows(run, "concurrency=1"):
        assert r["ttft_ms"] == pytest.approx(3 * one * 1e3, abs=1e-6)
        assert r["e2el_ms"] == pytest.approx(6 * one * 1e3, abs=1e-6)


def test_eos_lengths_end_answers_early(exp_model, tmp_path):
    """With ignore_eos off, a request given an EOS length of 2 stops there ("stop"); one without a
    length runs to max_tokens ("length")."""
    path = write_config(tmp_path / "c.toml", exp_model, BODY + "[sampling]\nignore_eos = false\n")
    run = replay(load(path), path.read_text(), planted(), tmp_path / "out", lengths={"r0000": 2})
    recs = [json.loads(ln) for ln in (run / "reference-simulated" / "requests.jsonl").read_text().splitlines()]
    got = {r["request_id"]: (len(r["output_token_ids"]), r["finish_reason"]) for r in recs
           if r["level"] == "concurrency=1"}
    assert got == {"r0000": (2, "stop"), "r0001": (4, "length"), "r0002": (4, "length")}
