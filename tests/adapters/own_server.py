"""`inferlab serve` on the tiny model: our own server's OpenAI and TGI routes, which the
engine adapters for TensorRT-LLM (OpenAI) and TGI speak to in tests."""
from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from pathlib import Path

from adapters.launcher import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def inferlab_serve(model: Path, log_dir: Path, kv_cache_tokens: int = 4096):
    """Yield the base URL of a running `inferlab serve MODEL`; stop its process tree after."""
    port = free_port()
    argv = [sys.executable, "-m", "experiments.cli", "serve", str(model), "--port", str(port),
            "--kv-cache-tokens", str(kv_cache_tokens), "--log-level", "warning"]
    srv = ServerProcess(argv, {"PYTHONPATH": str(REPO)}, log_dir / "serve.log", f"http://127.0.0.1:{port}/health",
                        cwd=REPO)
    await srv.start(timeout_s=180)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await srv.stop()
