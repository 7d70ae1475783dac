"""`inferlab serve` runs its engine core in a child process (the default): when that process dies,
/health and new requests answer 503 and SIGTERM still exits 0. `--no-engine-process` serves from a
thread (AsyncEngine, tests/reference_engine/test_async_engine.py)."""
from __future__ import annotations

import os
import signal
import time

import httpx
import psutil

from reference_engine.server.cli import parse

BODY = {"prompt": [1, 2, 3, 4], "max_tokens": 4, "temperature": 0}


def test_a_killed_engine_process_turns_the_server_503(launch):
    s = launch()
    assert httpx.get(s.url + "/server_info", timeout=10).json()["effective"]["engine_process"] is True
    assert httpx.post(s.url + "/v1/completions", json=BODY, timeout=60).json()["usage"]["completion_tokens"] == 4
    [core] = psutil.Process(s.proc.pid).children()
    os.kill(core.pid, signal.SIGKILL)
    for _ in range(100):  # the front end learns it from the pipe's end, on its event loop
        if httpx.get(s.url + "/health", timeout=10).status_code == 503:
            break
        time.sleep(0.05)
    assert httpx.get(s.url + "/health", timeout=10).status_code == 503
    r = httpx.post(s.url + "/v1/completions", json=BODY, timeout=60)
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
    assert s.stop() == 0


def test_the_engine_process_is_the_default_and_the_thread_a_flag():
    assert parse(["m"]).engine_process is True and parse(["m", "--no-engine-process"]).engine_process is False
