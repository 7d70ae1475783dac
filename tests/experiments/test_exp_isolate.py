"""experiments/running/isolate.py: an adapter run in a process of its own behaves like itself."""
from __future__ import annotations

import asyncio
import json

import pytest

from adapters.base import GenerationRequest, SamplingConfig
from experiments.commands.run import run_main
from experiments.running.isolate import Isolated
from tests.experiments.exp_util import write_config
from tests.experiments.paced_engine import token_ids

TARGET = "tests.experiments.paced_engine:PacedEngine"


async def _collect(engine, prompt, n):
    req = GenerationRequest("r1", prompt, SamplingConfig(max_tokens=n))
    return [ev async for ev in engine.generate(req)]


def test_isolated_engine_streams_the_same_tokens():
    async def go():
        eng = Isolated(TARGET, "m", "float32", {"pattern": [2, 1], "period_ms": 1})
        info = await eng.start()
        try:
            evs = await _collect(eng, [4, 5, 6], 7)
            snap = await eng.snapshot()
        finally:
            await eng.stop()
        return info, eng, evs, snap

    info, eng, evs, snap = asyncio.run(go())
    assert info.mode == "own_process" and info.pid == eng.proc.pid
    assert [len(e.token_ids) for e in evs] == [2, 1, 2, 1, 1]
    assert [t for e in evs for t in e.token_ids] == token_ids([4, 5, 6], 0, 7)
    assert [e.finished for e in evs] == [False] * 4 + [True] and evs[-1].finish_reason == "length"
    assert all(b.recv_ns > a.recv_ns for a, b in zip(evs, evs[1:]))
    assert eng.proc.returncode is not None  # stopped: no child left
    assert snap.t_ns > 0


def test_isolated_start_failure_is_reported():
    async def go():
        eng = Isolated(TARGET.replace("PacedEngine", "NoSuchEngine"), "m", "float32", {})
        try:
            await eng.start()
        finally:
            await eng.stop()

    with pytest.raises(RuntimeError, match="exited with code 1"):
        asyncio.run(go())


def test_isolate_in_a_config(tmp_path, exp_model, paced):
    cfg = write_config(tmp_path / "c.toml", exp_model, """
        engine = "paced"
        isolate = ["paced"]
        [workload]
        num_requests = 4
        output_len = 5
        [load]
        concurrency = [2]
    """, name="iso")
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    m = json.loads((tmp_path / "res/iso/paced/manifest.json").read_text())
    assert m["status"] == "ok" and m["info"]["mode"] == "own_process" and m["same_process"] is False
    recs = [json.loads(s) for s in (tmp_path / "res/iso/paced/requests.jsonl").read_text().splitlines()]
    assert all(r["output_token_ids"] == token_ids(r["prompt_token_ids"], 0, 5) for r in recs) and len(recs) == 4


def test_in_process_engines_leave_the_harness_interpreter_unless_told(tmp_path, exp_model):
    """The light-observer rule: an in-process adapter runs in a child process by default."""
    from experiments.running.runner import build_engine
    from experiments.workload.config import load

    body = """
        engine = "reference"
        [engine_options.reference]
        mode = "in_process"
    """
    cfg = load(write_config(tmp_path / "a.toml", exp_model, body))
    engine, _, _ = build_engine(cfg, "reference", tmp_path)
    assert type(engine).__name__ == "Isolated"
    cfg = load(write_config(tmp_path / "b.toml", exp_model, 'same_interpreter = ["reference"]\n' + body))
    engine, _, _ = build_engine(cfg, "reference", tmp_path)
    assert engine.in_process and type(engine).__name__ == "ReferenceInProcess"
