"""`inferlab serve --step-log PATH`: the engine core appends each step it ran, and a request's steps
add up to what the client got."""
from __future__ import annotations

import time

import httpx

from reference_engine.engine.step_log import read


def test_served_steps_add_up_to_the_response(server):
    server.wait_idle()  # an earlier test's abandoned stream must not run into this one's steps
    since = time.time()
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": str(server.model_dir), "prompt": "one two three four five six seven", "max_tokens": 7,
        "temperature": 0.0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    logged = read(str(server.step_log))
    assert len(logged) == 1  # one writer: the engine core's process
    steps = [s for v in logged.values() for s in v if s.t >= since]
    rids = {rid for s in steps for rid, _, _ in s.scheduled}
    assert len(rids) == 1, rids  # only this request ran since
    [rid] = rids
    prefill = sum(n for s in steps for r_, n, k in s.scheduled if k == "prefill")
    assert prefill == usage["prompt_tokens"]
    assert sum(s.new_tokens.get(rid, 0) for s in steps) == usage["completion_tokens"] == 7
    assert rid in steps[-1].finished and all(isinstance(s.duration_s, float) for s in steps)


def test_a_step_log_it_cannot_write_is_one_line_and_exit_2(model_dir, tmp_path, capsys):
    from reference_engine.server.cli import main

    path = tmp_path / "no such folder" / "steps.jsonl"
    assert main([str(model_dir), "--step-log", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "step_log" in err and str(path) in err and "No such file" in err
