"""The reference engine, in the harness's own process or behind `inferlab serve`.

Options: `mode` = "in_process" (default) | "server" | "attach", plus the engine knobs in
`KNOBS` (passed to `EngineConfig` in-process; server mode takes `SERVER_KNOBS` as flags).
`enable_prefix_caching` and `speculative_config` are the uniform features (adapters.common.features),
which are also the engine's own EngineConfig fields and `inferlab serve` flags.

`EngineInfo.effective` / `.memory` in-process come from the engine itself, through the async
engine's public API (`AsyncEngine.effective_config()` / `memory_report()`, which are
`LLMEngine`'s); `snapshot().extra` carries its prefix-cache and speculation counters.

in_process shares the harness's interpreter: the engine's step loop and the load
generator take turns holding the GIL, so the client perturbs the engine it measures.
Use it for offline throughput only; latency comparisons use mode = "server"
(see `adapters/engines/reference/server.py`), where the engine runs in a process of its own.
Modes (adapters/registry.py `create`): "in_process" (the default), "server" (launch `inferlab serve`),
"attach" (`url` of a running `inferlab serve`).
"""
from __future__ import annotations

import time
from typing import Any, AsyncIterator

from adapters.base import (Engine, EngineInfo, EngineUnavailable, GenerationRequest, MemorySnapshot, TokenEvent,
                           check_options)
from adapters.common import features
from adapters.common.readback import ReadBack

KNOBS = ("block_size", "kv_cache_tokens", "kv_cache_bytes", "max_num_seqs", "max_num_batched_tokens",
         "max_model_len", "enable_chunked_prefill", "attention_backend", "linear_backend", "fused_ops", "num_threads",
         "device", "seed", "enable_prefix_caching", "speculative_config", "tensor_parallel_size", "step_log")
# The knobs `inferlab serve` takes as flags (max_waiting: requests beyond it get 503).
SERVER_KNOBS = ("block_size", "kv_cache_tokens", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                "attention_backend", "linear_backend", "fused_ops", "num_threads", "device", "seed", "max_waiting",
                "enable_prefix_caching", "speculative_config", "tensor_parallel_size", "engine_process", "step_log",
                "data_parallel_size", "router")
# EngineStats counters copied into snapshot().extra
COUNTERS = ("num_preemptions_total", "prefix_cache_queries", "prefix_cache_hits", "spec_decode_num_drafts",
            "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens", "tp_decode_steps", "tp_decode_seconds",
            "tp_decode_allreduce_seconds", "tp_decode_allreduce_bytes", "request_queue_time_s", "request_queue_count")


async def read_back(engine) -> tuple[dict, dict[str, int]]:
    """EngineInfo.effective / .memory from a started `AsyncEngine`'s own reports."""
    rb = ReadBack()
    for k, v in engine.effective_config().items():
        rb.put(k, v if k != "speculative" else (v or False), "LLMEngine.effective_config()")
    for k, v in (await engine.memory_report()).items():
        rb.mem(k, v, "LLMEngine.memory_report()")
    return rb.result()


def check_here(model: str, dtype: str, options: dict[str, Any]) -> None:
    """The engine runs on this machine (in-process, or a server launched here): an impossible kernel pin
    or a model and KV budget beyond free RAM is a config error now (one line, exit 2), not at every step."""
    from reference_engine import EngineConfig, check_ram, kernel_problems

    fields = set(EngineConfig.__dataclass_fields__) - {"model", "dtype"}
    cfg = EngineConfig(model=model, dtype=dtype, **{k: v for k, v in options.items() if k in fields})
    if problems := kernel_problems(cfg):
        raise ValueError("; ".join(problems))
    check_ram(cfg)


def to_sampling_params(request: GenerationRequest):
    """The harness's SamplingConfig as the reference engine's SamplingParams (ValueError on bad values)."""
    from reference_engine import SamplingParams

    s = request.sampling
    return SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          min_p=s.min_p, seed=s.seed, stop=list(s.stop), ignore_eos=s.ignore_eos)


class ReferenceInProcess(Engine):
    """`reference_engine.AsyncEngine` in this interpreter (its model steps run in the engine's own thread)."""

    in_process = True

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        if (self.options.get("data_parallel_size") or 1) > 1:
            raise ValueError("engine 'reference': [parallel] data > 1 runs that many engine cores behind one "
                             "`inferlab serve`: set mode = \"server\"")
        check_options(self.name, self.options, set(KNOBS))
        features.prefix_caching(self.name, self.options)
        features.speculative(self.name, self.options.get("speculative_config"))
        check_here(model, dtype, self.options)
        self.engine = None
        self.info: EngineInfo | None = None

    async def start(self) -> EngineInfo:
        if self.info is not None:
            return self.info
        try:
            from reference_engine import AsyncEngine, EngineConfig
        except ImportError as e:  # torch missing: the reference engine is a core dependency
            raise EngineUnavailable(f"the reference engine cannot be imported ({e}); pip install inferlab") from e
        self.engine = AsyncEngine(EngineConfig(model=self.model, dtype=self.dtype, **self.options))
        await self.engine.start()
        st = self.engine.stats()
        knobs = {k: getattr(self.engine.config, k) for k in KNOBS if hasattr(self.engine.config, k)}
        knobs["max_model_len"] = self.engine.max_model_len
        effective, memory = await read_back(self.engine)
        self.info = EngineInfo(engine=self.name, version=self.engine.version,
                               model=self.engine.model_name, dtype=effective.get("dtype", self.dtype),
                               kv_capacity_tokens=st.kv_capacity_tokens, block_size=st.block_size, knobs=knobs,
                               mode="in_process", pid=None, effective=effective, memory=memory,
                               unhonoured=features.gaps(self.name, self.options, effective))
        return self.info

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self.engine is None:
            raise RuntimeError("engine 'reference': call start() before generate()")
        rid = request.request_id
        # AsyncEngine.generate aborts the request if our consumer leaves early
        async for d in self.engine.generate(list(request.prompt_token_ids), to_sampling_params(request), rid):
            recv_ns = time.perf_counter_ns()
            if d.finished:
                yield TokenEvent(rid, d.new_token_ids, d.text_delta, recv_ns, True, d.finish_reason,
                                 d.num_prompt_tokens, d.num_output_tokens)
            else:
                yield TokenEvent(rid, d.new_token_ids, d.text_delta, recv_ns)

    async def abort(self, request_id: str) -> None:
        if self.engine is not None:
            self.engine.abort(request_id)

    async def reset_prefix_cache(self) -> bool:
        return bool(await self.engine.reset_prefix_cache()) if self.engine is not None else False

    async def snapshot(self) -> MemorySnapshot:
        snap = MemorySnapshot(t_ns=time.perf_counter_ns())
        if self.engine is None:
            return snap
        st = self.engine.stats()
        snap.kv_used_tokens = st.kv_used_blocks * st.block_size
        snap.kv_capacity_tokens = st.kv_capacity_tokens
        snap.kv_usage = st.kv_usage
        snap.num_running, snap.num_waiting = st.num_running, st.num_waiting
        snap.extra = {k: getattr(st, k) for k in COUNTERS}
        return snap

    async def memory(self) -> dict[str, int]:
        return (await read_back(self.engine))[1] if self.engine is not None else {}

    async def stop(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            await engine.shutdown()
