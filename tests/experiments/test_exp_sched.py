"""experiments.running.sched against real processes: the autogroup verdict and the listener lookup."""
from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from adapters.transport.launcher import free_port
from experiments.running import sched

SERVE = "import http.server, sys; http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), " \
        "http.server.SimpleHTTPRequestHandler).serve_forever()"


def _autogroup_on() -> bool:
    return sched.autogroup("self") is not None and sched.SWITCH.exists() and sched.SWITCH.read_text().strip() == "1"


@pytest.fixture
def serve(tmp_path):
    procs = []

    def start(own_session: bool) -> tuple[subprocess.Popen, str]:
        port = free_port()
        p = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], cwd=tmp_path, start_new_session=own_session,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                httpx.get(url, timeout=1.0)
                return p, url
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("test server did not start")

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_a_server_in_its_own_session_is_flagged(serve):
    p, url = serve(own_session=True)
    by_pid = sched.placement(p.pid, None)
    if not _autogroup_on():  # switched off, or /proc does not say which group: no verdict, never a guess
        assert by_pid["engine_pid"] == p.pid and by_pid["warning"] is None
        assert not by_pid["enabled"] or by_pid["harness_group"] is None
        return
    assert by_pid["engine_group"] != by_pid["harness_group"] and "autogroup" in by_pid["warning"]
    by_url = sched.placement(None, url)  # attached: found through the port it listens on
    assert by_url["engine_pid"] == p.pid and by_url["warning"] == by_pid["warning"]


def test_a_server_in_the_harness_session_is_not(serve):
    p, url = serve(own_session=False)
    s = sched.placement(None, url)
    assert s["engine_pid"] == p.pid and s["engine_group"] == s["harness_group"] and s["warning"] is None


def test_remote_or_unknown_servers_get_no_verdict():
    assert sched.listener("http://192.0.2.1:8000") is None  # TEST-NET-1: not this machine
    s = sched.placement(None, f"http://127.0.0.1:{free_port()}")  # nobody listens there
    assert s["engine_pid"] is None and s["engine_group"] is None and s["warning"] is None
    assert sched.autogroup(10 ** 9) is None
