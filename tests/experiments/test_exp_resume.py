"""An engine killed mid-run: finished requests stay in the JSONL, the run is marked failed
with the reason, and `--resume` sends only the missing requests and completes it.
Also: every engine in a comparison received identical prompt token ids (from the JSONL)."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from experiments.commands.report import main as report_main
from experiments.commands.run import run_main
from experiments.workload.workloads import build
from tests.experiments.exp_util import write_config

BODY = """
    engines = ["paced", "paced2"]
    [engine_options.paced]
    period_ms = 5
    [engine_options.paced2]
    period_ms = 5
    [workload]
    num_requests = 12
    input_len = [8, 24]
    output_len = 20
    [load]
    concurrency = [2]
    warmup = 1
"""


def lines(path: Path) -> list[dict]:
    return [json.loads(s) for s in path.read_text().splitlines()] if path.is_file() else []


def kill_after(engine_dir: Path, n_done: int, killed: list[int]) -> threading.Thread:
    """SIGKILL the engine's process once `n_done` requests are in its JSONL. It watches until it kills or
    the test sets `.done` (after the run returned): no deadline, so a slow start on a busy machine (a
    server taking minutes to come up) cannot make it give up before the run reaches `n_done`."""
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            m = engine_dir / "manifest.json"
            pid = (json.loads(m.read_text()).get("info") or {}).get("pid") if m.is_file() else None
            if pid and len(lines(engine_dir / "requests.jsonl")) >= n_done:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.005)

    t = threading.Thread(target=watch, daemon=True)
    t.done = done
    t.start()
    return t


def test_killed_engine_keeps_finished_requests_and_resume_completes(tmp_path, exp_model, paced):
    cfg = write_config(tmp_path / "c.toml", exp_model, BODY, name="kill")
    out = tmp_path / "res"
    ed = out / "kill" / "paced"
    killed: list[int] = []
    watcher = kill_after(ed, 3, killed)
    assert run_main([str(cfg), "--out", str(out), "--no-progress"]) == 1
    watcher.done.set()
    watcher.join()
    assert killed
    m = json.loads((ed / "manifest.json").read_text())
    assert m["status"] == "failed" and "exited with code -9" in m["reason"]
    first = lines(ed / "requests.jsonl")
    assert 3 <= len(first) < 12
    assert all(r["finish_reason"] == "length" and len(r["output_token_ids"]) == 20 for r in first)
    # the other engine still ran, after the failure
    assert json.loads((out / "kill/paced2/manifest.json").read_text())["status"] == "ok"

    assert run_main([str(cfg), "--out", str(out), "--resume", "--no-progress"]) == 0
    m = json.loads((ed / "manifest.json").read_text())
    assert m["status"] == "ok" and m["repeats"]["1"]["sessions"] == 2 and m["reason"] is None
    done = lines(ed / "requests.jsonl")
    assert done[: len(first)] == first  # nothing finished was lost or rewritten
    ids = [r["request_id"] for r in done]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 12  # each missing request sent exactly once
    assert {r["session"] for r in done[len(first):]} == {2}
    # paced2 was complete: resume left it alone
    assert len(lines(out / "kill/paced2/requests.jsonl")) == 12

    # identical prompt token ids for every engine, equal to the workload's
    from experiments.workload.config import load

    c = load(cfg)
    items, _ = build(c.model, c.workload, c.load.warmup)
    want = {it.request_id: it.prompt_token_ids for it in items}
    for eng in ("paced", "paced2"):
        got = {r["request_id"]: r["prompt_token_ids"] for r in lines(out / "kill" / eng / "requests.jsonl")}
        assert got == want
    report = (out / "kill/report.md").read_text()
    assert "Prompt token ids identical across engines (from requests.jsonl): yes" in report
    # the same deterministic fixture engine twice: every greedy token agrees
    assert "| paced2 | concurrency=2 | 12 | 1.000 | 1.000 |" in report


def test_report_merges_runs(tmp_path, exp_model, paced):
    out = tmp_path / "res"
    for name, eng in (("a", "paced"), ("b", "paced2")):
        cfg = write_config(tmp_path / f"{name}.toml", exp_model, BODY.replace('engines = ["paced", "paced2"]',
                                                                              f'engine = "{eng}"'), name=name)
        assert run_main([str(cfg), "--out", str(out), "--no-progress"]) == 0
    merged = tmp_path / "merged"
    assert report_main([str(out / "a"), str(out / "b"), "--out", str(merged)]) == 0
    text = (merged / "report.md").read_text()
    assert "| metric | paced | paced2 |" in text
    assert (merged / "plots" / "cdf_ttft.png").stat().st_size > 1000
    assert report_main([str(tmp_path)]) == 2  # not a run folder: one line, exit 2


@pytest.mark.slow
def test_reference_server_killed_with_sigkill_then_resumed(tmp_path, exp_model):
    """The same with the real reference engine behind `inferlab serve`."""
    cfg = write_config(tmp_path / "c.toml", exp_model, """
        engine = "reference"
        [engine_options.reference]
        mode = "server"
        [workload]
        num_requests = 10
        input_len = 16
        output_len = 24
        [load]
        concurrency = [1]
        warmup = 1
        [kv]
        tokens = 2048
    """, name="refkill")
    out = tmp_path / "res"
    ed = out / "refkill" / "reference"
    killed: list[int] = []
    watcher = kill_after(ed, 2, killed)
    assert run_main([str(cfg), "--out", str(out), "--no-progress"]) == 1
    watcher.done.set()
    watcher.join()
    m = json.loads((ed / "manifest.json").read_text())
    assert killed and m["status"] == "failed" and m["reason"]
    first = lines(ed / "requests.jsonl")
    assert 2 <= len(first) < 10
    assert run_main([str(cfg), "--out", str(out), "--resume", "--no-progress"]) == 0
    done = lines(ed / "requests.jsonl")
    assert done[: len(first)] == first and sorted(r["request_id"] for r in done) == [f"r{i:04d}" for i in range(10)]
    assert json.loads((ed / "manifest.json").read_text())["status"] == "ok"
