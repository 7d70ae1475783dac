"""The reference engine behind its own HTTP server (`python -m reference_engine.server`, which
`inferlab serve` also runs), in a process of its own.

Mode "server" launches `PY -m reference_engine.server MODEL --host H --port P --dtype D
--<knob> V ...` through `adapters.transport.server.ManagedServer` (options launcher, host, port,
log_path, work_dir, startup_timeout_s, extra_args, env), waits for /health, then streams
exactly as `OpenAIEngine` does; mode "attach" talks to `url`. The server exports vLLM's
Prometheus names (adapters.transport.metric_names.REFERENCE), so KV capacity and usage come from /metrics.

Flags: `enable_prefix_caching` -> `--enable-prefix-caching` / `--no-enable-prefix-caching`,
`speculative_config` -> `--speculative-config '<json>'` (the uniform features of adapters.common.features).
`reset_prefix_cache()` POSTs `/reset_prefix_cache`: 200 -> True, 409 (requests hold blocks) -> False.
`EngineInfo.effective` / `.memory`: `GET /server_info` when the server has it (its `effective` and
`memory` objects, the engine's own `effective_config()` / `memory_report()`; or vLLM's
`vllm_config` shape), else the `vllm:cache_config_info` labels and the KV gauges at /metrics.

Invariant: after `stop()` returns, no process of a launched server's tree is alive.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from adapters.common import features
from adapters.common.readback import ReadBack, server_info_json, vllm_shapes
from adapters.engines.reference.adapter import SERVER_KNOBS, check_here
from adapters.transport.metric_names import TP_COUNTERS, VLLM, MetricNames
from adapters.transport.openai import OpenAIEngine
from adapters.transport.server import LaunchedServer

# `inferlab serve` exports vLLM's names (reference_engine/server/metrics.py) minus per-request TPOT,
# plus its tensor-parallel decode counters (inferlab:tp_*, only with tensor_parallel_size > 1).
REFERENCE = MetricNames(**{**VLLM.__dict__, "engine": "reference", "tpot": None,
                           **{k: (f"inferlab:{k}_total",) for k in TP_COUNTERS}})
REPO_ROOT = Path(__file__).resolve().parents[3]
INSTALL = "pip install inferlab (or -e .) into the interpreter given as launcher"


def front_end_rss(pid: int | None) -> int | None:
    """The launched server's own RSS when its engine core runs in a child process (`--engine-process`, the
    default): all of it is interpreter, libraries, tokenizer and HTTP state. None without a child."""
    import psutil

    try:
        root = psutil.Process(pid) if pid else None
        return root.memory_info().rss if root is not None and root.children() else None
    except psutil.Error:
        return None


class ReferenceServer(LaunchedServer, OpenAIEngine):
    OPTIONS = OpenAIEngine.OPTIONS | LaunchedServer.OPTIONS | set(SERVER_KNOBS)
    INSTALL = INSTALL
    METRICS = REFERENCE
    KV_HOW = "inferlab serve --kv-cache-tokens"

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        if self.mode == "attach":
            given = sorted(set(SERVER_KNOBS) & set(self.options) - {"kv_cache_tokens", *features.OPTIONS})
            if given:
                raise ValueError(f"engine 'reference': option(s) {', '.join(given)} need mode = \"server\" "
                                 f"(an attached server's knobs were fixed when it started)")
        else:
            check_here(model, dtype, self.options)

    def flags(self) -> list[str]:
        """`inferlab serve` flags for the knobs given: `max_num_seqs=8` -> `--max-num-seqs 8`, a bool
        -> `--x` / `--no-x`, a table (speculative_config) -> `--x '<json>'`."""
        out: list[str] = []
        for k in SERVER_KNOBS:
            v, flag = self.options.get(k), "--" + k.replace("_", "-")
            if isinstance(v, bool):
                out.append(flag if v else "--no-" + flag[2:])
            elif isinstance(v, dict):
                out += [flag, json.dumps(v, separators=(",", ":"))]
            elif v is not None:
                out += [flag, str(v)]
        return out

    async def _engine_read_back(self, rb: ReadBack) -> None:
        info = await server_info_json(self._client)
        for k, v in (info.get("effective") or {}).items():
            rb.put(k, v if k != "speculative" else (v or False),
                   "/server_info effective (LLMEngine.effective_config())")
        for k, v in (info.get("memory") or {}).items():
            rb.mem(k, v, "/server_info memory (LLMEngine.memory_report())")
        vllm_shapes(rb, info, self._first_metrics, self.METRICS.cache_info)
        rb.mem("runtime_front", front_end_rss(self.pid), "RSS of the server's front-end process at start (psutil): "
               "it holds no weights, its engine core is a child process")

    async def memory(self) -> dict[str, int]:
        info = await server_info_json(self._client) if self._client is not None else {}
        return {k: int(v) for k, v in (info.get("memory") or {}).items() if v is not None}

    def server_argv(self) -> list[str]:
        s = self.server
        return s.argv(module="reference_engine.server", args=[s.model_arg, "--host", s.host, "--port", s.port,
                                                              "--dtype", self.dtype, "--log-level", "warning",
                                                              *self.flags()])

    def server_env(self, work_dir: Path | None) -> dict[str, str]:
        # The server runs in work_dir; it imports `reference_engine` from this checkout even
        # when inferlab is not pip-installed.
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
        return {"PYTHONPATH": path}

    def _knobs(self) -> dict[str, Any]:
        return {**super()._knobs(), **{k: self.options[k] for k in SERVER_KNOBS if k in self.options}}
