"""vLLM's dry-run checks: the launch arguments through vLLM's own parser and the request bodies through
its own request models (CompletionRequest, ChatCompletionRequest), both in .venv-vllm
(upstream_check.py runs there); the version it expects is its spec's pinned image."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.checks.contracts import found, launcher_python
from adapters.checks.dryrun import DryRun, own_code_checks, venv_python
from adapters.common.versions import image_tag_version

CHECKER = Path(__file__).parent / "upstream_check.py"
READS = ("GET /server_info?config_format=json (dev mode, on for launched servers): dtype, KV geometry, "
         "scheduler limits, prefix caching, CUDA graphs, speculation, parallel sizes",
         "vllm:cache_config_info labels (KV blocks x block size, per replica)", "GET /v1/models max_model_len",
         "the startup log: engine config, KV size and memory lines")


def check(adapter: Any, d: DryRun) -> None:
    image = adapter.spec.image
    d.version = [f"expects vLLM {image_tag_version(['', image])} (the version the adapter is tested "
                 f"against: .venv-vllm, {image}); {found(adapter, 'vllm')}",
                 "read back: GET /version"]
    py = venv_python(launcher_python(adapter), "vllm", ".venv-vllm")
    d.checks += own_code_checks("vllm", py, CHECKER, d.launch.server_args if d.launch else [], d.requests)
