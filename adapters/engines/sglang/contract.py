"""SGLang's dry-run checks: the launch arguments through SGLang's own parser and the request bodies
through its own request models (GenerateReqInput, SamplingParams), both in .venv-sglang, where its
Python code is installed without its GPU parts (upstream_check.py runs there); the version row and
metric names the launch would use."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from adapters.checks.contracts import found, launcher_python
from adapters.checks.dryrun import DryRun, metric_lines, own_code_checks, venv_python

CHECKER = Path(__file__).parent / "upstream_check.py"
READS = ("GET /server_info: dtype (as requested), max_total_num_tokens, page_size, context_length, "
         "chunked_prefill_size, disable_radix_cache, cuda_graph_config, speculative_*, tp/pp/dp size, "
         "enable_deterministic_inference (seeded sampling), internal_states[0].memory_usage",)


def check(adapter: Any, d: DryRun) -> None:
    row = adapter.launch_row()
    d.metrics = metric_lines(row.values["metrics"])
    d.version = [f"row {row.span()} (checked: {', '.join(row.checked)}); {found(adapter, 'sglang')}",
                 "read back: GET /server_info version (refused when no row covers it)"]
    vocab = None
    try:
        vocab = json.loads((Path(adapter.model) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        pass
    py = venv_python(launcher_python(adapter), "sglang", ".venv-sglang")
    d.checks += own_code_checks("sglang", py, CHECKER, d.launch.server_args if d.launch else [],
                                d.requests, {"vocab_size": vocab})
