"""ServerProcess against real subprocesses; Launcher command lines."""
from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import httpx
import psutil
import pytest

from adapters.base import EngineUnavailable
from adapters.transport.launcher import Launcher, ServerProcess, ServerStartError, free_port, holds_port

# A real HTTP server that forks a grandchild (like an engine's worker) and prints its pid.
SERVER = textwrap.dedent("""
    import http.server, subprocess, sys, os
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("worker", child.pid, "env", os.environ.get("INFERLAB_T"), flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")

# Ignores SIGTERM, so stop() must escalate to SIGKILL.
STUBBORN = textwrap.dedent("""
    import signal, http.server, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self): self.send_response(200); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def test_free_port_is_bindable():
    import socket
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


async def test_start_health_stop_kills_tree(tmp_path):
    port = free_port()
    srv = ServerProcess([sys.executable, "-c", SERVER, str(port)], {"INFERLAB_T": "yes"},
                        tmp_path / "logs" / "server.log", f"http://127.0.0.1:{port}/health")
    await srv.start(timeout_s=30)
    assert srv.running() and srv.start_s is not None
    assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    tree = [srv.pid] + [c.pid for c in psutil.Process(srv.pid).children(recursive=True)]
    assert len(tree) == 2
    assert "env yes" in srv.log_tail(5) and srv.log_text().startswith("$ ")
    import os
    # its own process group (stop() signals it), but the harness's session: with autogroup
    # scheduling a session of its own would get an equal CPU share against the client's
    assert all(os.getpgid(p) == srv.pid for p in tree) and srv.pid != os.getpgid(0)
    assert all(os.getsid(p) == os.getsid(0) for p in tree)
    await srv.stop()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in tree)
    assert not srv.running()


async def test_exit_before_healthy_raises_with_log_tail(tmp_path):
    srv = ServerProcess([sys.executable, "-c", "print('boom: no model'); raise SystemExit(3)"], None,
                        tmp_path / "s.log", f"http://127.0.0.1:{free_port()}/health")
    with pytest.raises(ServerStartError, match=r"(?s)code 3.*boom: no model"):
        await srv.start(timeout_s=30)


async def test_another_server_on_the_port_is_not_taken_for_ours(tmp_path):
    """Another server took the port first: it answers /health, ours exits on the taken port. start()
    reports our exit (it used to return, and every later request went to the other server)."""
    import subprocess
    port = free_port()
    other = subprocess.Popen([sys.executable, "-c", STUBBORN, str(port)])
    srv = None
    try:
        while not _listening(port):
            await asyncio.sleep(0.05)
        late = "import time; time.sleep(1)  # loading a model\n" + STUBBORN
        srv = ServerProcess([sys.executable, "-c", late, str(port)], None, tmp_path / "s.log",
                            f"http://127.0.0.1:{port}/health")
        with pytest.raises(ServerStartError, match="(?s)exited with code 1.*Address already in use"):
            await srv.start(timeout_s=30)
        assert holds_port(other.pid, port) is True and holds_port(srv.pid, port) is False
    finally:
        other.kill()
        other.wait()
        if srv is not None and srv.proc is not None:
            await srv.stop(timeout_s=1)  # (it has exited; if start() ever returns early, it would not have)


def _listening(port: int) -> bool:
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_timeout_stops_the_process(tmp_path):
    srv = ServerProcess([sys.executable, "-c", "import time; print('loading'); time.sleep(600)"], None,
                        tmp_path / "s.log", f"http://127.0.0.1:{free_port()}/health")
    with pytest.raises(ServerStartError, match="not healthy"):
        await srv.start(timeout_s=1.5)
    assert not srv.running()


async def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    port = free_port()
    srv = ServerProcess([sys.executable, "-c", STUBBORN, str(port)], None, tmp_path / "s.log",
                        f"http://127.0.0.1:{port}/")
    await srv.start(timeout_s=30)
    await srv.stop(timeout_s=1)
    assert srv.proc.returncode == -9


async def test_missing_executable_is_engine_unavailable(tmp_path):
    srv = ServerProcess(["/nonexistent/bin/engine-serve"], None, tmp_path / "s.log", "http://127.0.0.1:1/")
    with pytest.raises(EngineUnavailable, match="engine-serve"):
        await srv.start(timeout_s=5)


def test_launcher_python_default_and_venv(tmp_path):
    assert Launcher.parse(None).argv(module="m.x", args=["--a", 1]) == [sys.executable, "-m", "m.x", "--a", "1"]
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "bin" / "trtllm-serve").write_text("")
    launcher = Launcher.parse(str(venv))
    assert launcher.prefix == [str(venv / "bin" / "python")]
    assert launcher.argv(script="trtllm-serve", args=["M"]) == [str(venv / "bin" / "trtllm-serve"), "M"]
    with pytest.raises(EngineUnavailable, match="no-such-script"):
        launcher.argv(script="no-such-script", args=[])


def test_relative_venv_becomes_absolute_without_leaving_the_venv(tmp_path, monkeypatch):
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    # the server runs in its work dir, so the path must be absolute; the symlink must not be followed
    assert Launcher.parse("venv").prefix == [str(tmp_path / "venv" / "bin" / "python")]


def test_launcher_bad_specs(tmp_path):
    with pytest.raises(EngineUnavailable, match="does not exist"):
        Launcher.parse(str(tmp_path / "missing-venv"))
    with pytest.raises(ValueError, match="venv folder"):
        Launcher.parse("python -X dev")


def test_launcher_container_argv(monkeypatch, tmp_path):
    # Building a command line needs a `docker` on PATH, not a running daemon.
    (tmp_path / "docker").write_text("#!/bin/sh\n")
    (tmp_path / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    launcher = Launcher.parse("docker run --rm --gpus all -p {port}:{port} -v /m:/m lmsysorg/sglang:v0.5")
    argv = launcher.argv(container_cmd=["python3", "-m", "sglang.launch_server"], args=["--port", 8000],
                         port=8000, name="inferlab-sglang-8000")
    assert argv == ["docker", "run", "--name", "inferlab-sglang-8000", "--rm", "--gpus", "all", "-p",
                    "8000:8000", "-v", "/m:/m", "lmsysorg/sglang:v0.5", "python3", "-m",
                    "sglang.launch_server", "--port", "8000"]
    assert launcher.stop_argv("inferlab-sglang-8000") == ["docker", "stop", "-t", "10", "inferlab-sglang-8000"]
    with pytest.raises(ValueError, match="podman run"):
        Launcher.parse("podman images")


# Binds a unix socket inside $TMPDIR (as vLLM's ZMQ IPC does), then serves /health.
UNIX_SOCKET_SERVER = textwrap.dedent("""
    import http.server, os, socket, sys, uuid
    path = os.path.join(os.environ["TMPDIR"], str(uuid.uuid4()))
    socket.socket(socket.AF_UNIX).bind(path)
    print("bound", path, flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self): self.send_response(200); self.end_headers()
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


async def test_managed_server_keeps_tmp_in_a_long_work_dir(tmp_path):
    from adapters.transport.server import ManagedServer

    work = tmp_path / ("w" * 60) / "engine-work"  # too long for a socket path of its own
    s = ManagedServer("toy", "model", {"work_dir": str(work), "extra_args": "--flag 'a b'"}, "/health")
    # extra_args (shell-split) land after the script's own port argument, which it ignores
    await s.start(lambda: [sys.executable, "-c", UNIX_SOCKET_SERVER, str(s.port)], lambda wd: {})
    try:
        assert s.proc.argv[-3:] == [str(s.port), "--flag", "a b"]
        bound = [ln for ln in s.log_text().splitlines() if ln.startswith("bound")][0].split()[1]
        assert len(bound) < 107 and Path(bound).resolve().parent == (work / "tmp").resolve()
        assert list((work / "tmp").iterdir())  # the socket file lives in the work dir
    finally:
        alias = s._alias
        await s.stop()
    assert alias is not None and not alias.exists() and not alias.parent.exists()


def test_a_container_launcher_mounts_what_the_adapter_writes_unless_already_mounted(tmp_path):
    """Issue 38, defect 2: the TRT-LLM options file lives in the work dir on the host; a container
    launcher that mounted only the model made `--extra_llm_api_options` unreadable inside."""
    from adapters.transport.launcher import Launcher, mounted

    work, model = tmp_path / "work", tmp_path / "models" / "m"
    lx = Launcher.parse("docker run --gpus all -v {model}:{model} img:1", installed=False)
    argv = lx.argv(args=["--x"], port=1, model=str(model), name="n", mounts=[str(work), str(model)])
    assert argv[:6] == ["docker", "run", "--name", "n", "-v", f"{work}:{work}"]
    assert argv.count(f"{model}:{model}") == 1 and argv[-2:] == ["img:1", "--x"]
    assert mounted(argv, str(work / "llm_api_options.yaml")) and not mounted(argv, str(tmp_path / "other"))
    assert mounted(["docker", "run", "--mount", f"type=bind,source={tmp_path},target={tmp_path}", "i"], str(work))
    assert not mounted(["docker", "run", "-v", f"{tmp_path}:/data", "i"], str(work))  # elsewhere inside
