"""The real server, as a subprocess on a free 127.0.0.1 port.

`launch(*flags, api_key=None)` starts `python -m reference_engine.server MODEL --port P ...`,
waits for GET /health, and stops it with SIGTERM at teardown (SIGKILL only if it hangs).
`server` is one shared instance for tests that do not count metrics or change settings.
A failed test that used a server which has exited carries that server's exit code and log tail
(a session server that dies fails every later test with "connection refused" and nothing else).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from adapters.transport.launcher import free_port, holds_port

REPO = Path(__file__).resolve().parents[3]
MAX_MODEL_LEN = 256
KV_TOKENS = 8192
# float32, not serve's "auto" (bf16 for these fp32 checkpoints): the tests compare served tokens with the
# in-process engine's float32 ones; test_cli.py checks the no-flag default.
BASE_FLAGS = ("--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-tokens", str(KV_TOKENS), "--dtype", "float32")


class Server:
    def __init__(self, model_dir: Path, flags: tuple[str, ...], api_key: str | None, log_dir: Path):
        self.model_dir, self.port = model_dir, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        cmd = [sys.executable, "-m", "reference_engine.server", str(model_dir), "--port", str(self.port),
               "--log-level", "warning", *flags] + (["--api-key", api_key] if api_key else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.log_path = log_dir / f"server-{self.port}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_healthy(timeout=120)

    def _wait_healthy(self, timeout: float) -> None:
        """Until our process answers /health: another server that took the port between free_port()
        and our bind answers too, while ours exits on the taken port (raised here, with its log)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200 \
                        and holds_port(self.proc.pid, self.port) is not False:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, keyed `name{label="v",...}` (labels sorted) or bare name."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "model_name")
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def wait_idle(self, timeout: float = 30) -> dict[str, float]:
        """Poll /metrics until no request runs or waits and no KV block is used; return the last scrape."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0 \
                    and m["vllm:kv_cache_usage_perc"] == 0:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle after {timeout}s: {m}")
            time.sleep(0.1)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.failed:
        for s in getattr(item, "funcargs", {}).values():
            if isinstance(s, Server) and s.proc.poll() is not None:
                tail = "\n".join(s.log().splitlines()[-40:])
                report.sections.append((f"server {s.url} had exited with {s.proc.returncode}", tail))


@pytest.fixture(scope="session")
def model_dir(tiny_llama) -> Path:
    return Path(tiny_llama)


@pytest.fixture(scope="session")
def launch_session(model_dir, tmp_path_factory):
    started: list[Server] = []

    def start(*flags: str, api_key: str | None = None) -> Server:
        s = Server(model_dir, BASE_FLAGS + flags, api_key, tmp_path_factory.mktemp("serve"))
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def launch(model_dir, tmp_path):
    """Start a private server for one test (its own settings, its own counters)."""
    started: list[Server] = []

    def start(*flags: str, api_key: str | None = None) -> Server:
        s = Server(model_dir, BASE_FLAGS + flags, api_key, tmp_path)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def server(launch_session, tmp_path_factory) -> Server:
    """Logs its steps (`--step-log`, read by test_step_log_serve.py): the log must cost the others nothing."""
    path = tmp_path_factory.mktemp("steps") / "steps.jsonl"
    s = launch_session("--step-log", str(path))
    s.step_log = path
    return s


@pytest.fixture(scope="session")
def offline(model_dir):
    """The offline engine with the server's settings: the ground truth for token equality."""
    from reference_engine import LLM

    return LLM(str(model_dir), max_model_len=MAX_MODEL_LEN, kv_cache_tokens=KV_TOKENS)

