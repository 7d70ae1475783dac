"""`inferlab serve` runs its engine core in a child process (the default). When that core dies or
stops stepping, open streams end with an error event, /health answers 503, and the server exits 1
so that a supervisor restarts it, as vLLM's does (--keep-alive-on-engine-death: it serves 503s
instead). SIGTERM / SIGINT at any moment (loading, serving, draining) ends the server and its core.
`--no-engine-process` serves from a thread (AsyncEngine, tests/reference_engine/engine/test_async_engine.py).

Every wait here is a hang detector (the old server hung in each case), not a time bound; how long
each exit took is measured by scripts, not asserted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from reference_engine.server.cli import parse

from .conftest import REPO, free_port

BODY = {"prompt": [1, 2, 3, 4], "max_tokens": 4, "temperature": 0}
STREAM = {"prompt": [1, 2, 3, 4], "max_tokens": 240, "temperature": 0, "ignore_eos": True, "stream": True}
HANG = 60  # seconds: a hang detector


def core_of(s) -> psutil.Process:
    [core] = psutil.Process(s.proc.pid).children()
    return core


def gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def mark(monkeypatch) -> str:
    """An environment marker every process started in this test inherits (the server, its core)."""
    value = f"{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("INFERLAB_TEST_MARK", value)
    return value


def leftovers(mark: str) -> list[int]:
    """Live processes that carry `mark`: what a stopped server left behind (orphans included)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("INFERLAB_TEST_MARK") == mark and not gone(p):
                out.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def open_stream(s):
    """A streaming completion that has produced its first token: (response context, line iterator)."""
    cm = httpx.stream("POST", s.url + "/v1/completions", json=STREAM, timeout=HANG)
    r = cm.__enter__()
    lines = r.iter_lines()
    assert next(line for line in lines if line.startswith("data: {"))
    return cm, lines


def last_events(lines) -> list[dict]:
    events = []
    try:
        for line in lines:
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    except httpx.HTTPError:
        pass  # the server went away after the error event
    return events


def test_a_killed_core_ends_the_streams_and_the_server_exits_1(launch, mark):
    s = launch()
    assert httpx.get(s.url + "/server_info", timeout=HANG).json()["effective"]["engine_process"] is True
    cm, lines = open_stream(s)
    core = core_of(s)
    core.kill()
    events = last_events(lines)
    cm.__exit__(None, None, None)
    assert "error" in events[-1] and "engine process died" in events[-1]["error"]["message"]
    assert s.proc.wait(HANG) == 1
    assert "the engine core died" in s.log() and gone(core) and leftovers(mark) == []


def test_keep_alive_serves_503s_and_control_calls_never_block_the_server(launch):
    """A stopped core: /server_info waits (in a thread), and /health still answers meanwhile: the
    call no longer reads the pipe on the event loop. Then kill -9: 503s, and SIGTERM exits 0."""
    s = launch("--keep-alive-on-engine-death")
    core = core_of(s)
    core.suspend()  # SIGSTOP
    info: list[httpx.Response] = []
    t = threading.Thread(target=lambda: info.append(httpx.get(s.url + "/server_info", timeout=HANG)))
    t.start()
    time.sleep(0.3)  # the call is now waiting on the stopped core
    assert httpx.get(s.url + "/health", timeout=HANG).status_code == 200 and not info
    core.resume()
    t.join(HANG)
    assert info[0].status_code == 200 and info[0].json()["memory"]["kv_allocated"] > 0

    core.kill()
    for _ in range(200):  # the front end learns it from the pipe's end, on its event loop
        if httpx.get(s.url + "/health", timeout=HANG).status_code == 503:
            break
        time.sleep(0.05)
    assert httpx.get(s.url + "/health", timeout=HANG).status_code == 503
    r = httpx.post(s.url + "/v1/completions", json=BODY, timeout=HANG)
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
    assert s.stop() == 0


def test_the_step_watchdog_ends_a_stopped_core_and_the_server(launch, mark):
    s = launch("--engine-step-timeout", "2")
    assert httpx.get(s.url + "/server_info", timeout=HANG).json()["effective"]["step_timeout_s"] == 2.0
    cm, lines = open_stream(s)
    core = core_of(s)
    core.suspend()
    events = last_events(lines)
    cm.__exit__(None, None, None)
    assert "stuck" in events[-1]["error"]["message"]
    assert s.proc.wait(HANG) == 1 and gone(core) and leftovers(mark) == []


def popen_serve(model: Path, tmp_path: Path, *flags: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # (with this test's mark)
    log = open(tmp_path / f"serve-{time.monotonic_ns()}.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "reference_engine.server", str(model), "--port", str(free_port()),
                             "--log-level", "warning", *flags], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def fifo_model(tmp_path: Path) -> Path:
    """config.json as a FIFO: the core blocks opening it, so the load never ends on its own."""
    d = tmp_path / "loads-forever"
    d.mkdir(exist_ok=True)
    if not (d / "config.json").exists():
        os.mkfifo(d / "config.json")
    return d


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_model_loads_exits_and_kills_the_core(tmp_path, sig, mark):
    p = popen_serve(fifo_model(tmp_path), tmp_path)
    front = psutil.Process(p.pid)
    while not front.children():  # the core exists: the load has begun
        assert p.poll() is None
        time.sleep(0.02)
    [core] = front.children()
    p.send_signal(sig)
    assert p.wait(HANG) == 0 and gone(core) and leftovers(mark) == []


@pytest.mark.parametrize("after", [0.0, 1.0, 2.0])
def test_a_signal_early_in_start_up_exits_and_leaves_nothing(tmp_path, tiny_llama, mark, after):
    """Wherever start-up is when it lands (imports, the core's fork, the load, the first request)."""
    p = popen_serve(tiny_llama, tmp_path)
    time.sleep(after)
    p.send_signal(signal.SIGTERM)
    assert p.wait(HANG) in (0, -signal.SIGTERM)  # -15: it came before the handlers were installed
    assert leftovers(mark) == []


def test_a_second_signal_ends_the_drain(launch, mark):
    """The first SIGTERM drains (the stream would run on for --shutdown-timeout); the second ends it. The core is
    stopped first, so that the stream cannot finish (and the server exit) between the two signals: on a fast
    machine 240 tokens of the tiny model took less than the 0.3 s between them, and the second signal landed on an
    interpreter already exiting (-15: a fresh-clone CI run, 2026-12-07)."""
    s = launch("--shutdown-timeout", "600")
    cm, lines = open_stream(s)
    core = core_of(s)
    core.suspend()  # SIGSTOP: the drain now waits on the stream for as long as it takes
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert s.proc.poll() is None  # draining the stream
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(HANG) == 0 and gone(core) and leftovers(mark) == []
    last_events(lines)
    cm.__exit__(None, None, None)


def test_the_engine_process_is_the_default_and_the_thread_a_flag():
    assert parse(["m"]).engine_process is True and parse(["m", "--no-engine-process"]).engine_process is False
    assert parse(["m"]).keep_alive_on_engine_death is False and parse(["m"]).engine_step_timeout is None
