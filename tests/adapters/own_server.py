"""`inferlab serve` on the tiny model, for harness tests (tests/experiments) that need a running
server. No adapter test uses it to stand in for TGI or TensorRT-LLM: our imitation of their routes
proves nothing about them (its /info still answers fields TGI >= 2.3 dropped); their adapters are
tested against recorded upstream responses and facts (fixtures/*/SOURCE.md)."""
from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from pathlib import Path

from adapters.transport.launcher import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def inferlab_serve(model: Path, log_dir: Path, kv_cache_tokens: int = 4096):
    """Yield the base URL of a running `inferlab serve MODEL`; stop its process tree after."""
    port = free_port()
    argv = [sys.executable, "-m", "experiments.cli", "serve", str(model), "--port", str(port),
            "--kv-cache-tokens", str(kv_cache_tokens), "--log-level", "warning",
            "--dtype", "float32"]  # the planted models' tokens are float32's (serve's "auto" would be bf16)
    srv = ServerProcess(argv, {"PYTHONPATH": str(REPO)}, log_dir / "serve.log", f"http://127.0.0.1:{port}/health",
                        cwd=REPO)
    await srv.start(timeout_s=180)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await srv.stop()
