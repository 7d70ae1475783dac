"""TensorRT-LLM: `trtllm-serve` (OpenAI routes) launched or attached, or `tensorrt_llm.LLM` in-process.

Facts this adapter relies on are recorded with their upstream file and commit in
tests/adapters/fixtures/trtllm/SOURCE.md (facts.json holds them for the tests).

- Server: `trtllm-serve MODEL --host H --port P [--backend B] [--max_batch_size N] ...
  --extra_llm_api_options WORK/llm_api_options.yaml` (newer releases also call it `--config`).
  trtllm-serve has no `--dtype` flag: the dtype goes in the options file as the LLM-API field
  `dtype`, and the file also turns on what the harness needs: `return_perf_metrics: true`
  (without it there is no Prometheus text at `/prometheus/metrics`) and
  `enable_iter_perf_stats: true` (without it the KV and queue gauges stay empty).
- The file's `kv_cache_config` *replaces* the one trtllm-serve builds from its command line
  (top-level merge), so `kv_cache_free_gpu_memory_fraction` goes into the file too, never on
  the command line. `kv_cache_tokens` becomes `kv_cache_config.max_tokens`, which is an upper
  bound (TRT-LLM uses the minimum of it and what the free-memory fraction allows): the
  capacity read back from `trtllm_kv_cache_max_blocks x trtllm_kv_cache_tokens_per_block`
  decides whether the budget was honoured (`EngineInfo.unhonoured` says when not).
- Requests: trtllm-serve's request models forbid unknown fields (HTTP 400), so vLLM's
  `return_token_ids` is never sent; token ids stream only with `detokenize: false`, and then
  every chunk's text is empty (so stop strings, matched on text, are not used here).
- `/metrics` is a JSON iteration-stats endpoint that is drained on read: never scraped.
- In-process: `tensorrt_llm.LLM(...).generate_async(ids, sampling, streaming=True)`; its
  outputs are cumulative, and `token_ids_diff` / `text_diff` give the new part.
Needs a CUDA host: `tensorrt_llm` is imported only in `start()`.
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, AsyncIterator

from adapters import prom
from adapters.base import EngineInfo, GenerationRequest, TokenEvent, check_options
from adapters.metric_names import TRTLLM
from adapters.openai_compat import OpenAIEngine
from adapters.serving import HeldEngine, LaunchedServer, ModalEngine, kv_pin_gap, need

INSTALL = ("run TensorRT-LLM's release container (launcher = \"docker run --gpus all --ipc host --network host "
           "-v {model}:{model} nvcr.io/nvidia/tensorrt-llm/release:TAG\"), or on a CUDA host "
           "`apt-get install libopenmpi-dev && pip install tensorrt_llm` (the PyPI wheel is the full package)")
# trtllm-serve flags passed through: option name == --flag (underscores, as trtllm-serve spells them).
FLAGS = ("max_batch_size", "max_num_tokens", "max_seq_len", "tp_size", "backend")
KV_HOW = "kv_cache_config.max_tokens (an upper bound: TRT-LLM takes the minimum with the free-memory fraction)"
CAPACITY_WAIT_S = 10.0  # the KV gauges are iteration stats: they appear after the first iterations


def llm_api_options(options: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The LLM-API options file trtllm-serve gets (`--extra_llm_api_options`)."""
    kv: dict[str, Any] = {}
    if options.get("kv_cache_free_gpu_memory_fraction") is not None:
        kv["free_gpu_memory_fraction"] = float(options["kv_cache_free_gpu_memory_fraction"])
    if options.get("kv_cache_tokens") is not None:
        kv["max_tokens"] = int(options["kv_cache_tokens"])
    if options.get("enable_block_reuse") is not None:
        kv["enable_block_reuse"] = bool(options["enable_block_reuse"])
    out: dict[str, Any] = {"dtype": dtype, "return_perf_metrics": True, "enable_iter_perf_stats": True}
    return {**out, "kv_cache_config": kv} if kv else out


class TRTLLMEngine(ModalEngine):
    name = "trtllm"
    IMPLS = {"server": "adapters.trtllm:TRTLLMServer", "attach": "adapters.trtllm:TRTLLMServer",
             "in_process": "adapters.trtllm:TRTLLMInProcess"}


class TRTLLMServer(LaunchedServer, OpenAIEngine):
    name = "trtllm"
    OPTIONS = (OpenAIEngine.OPTIONS | LaunchedServer.OPTIONS | set(FLAGS)
               | {"kv_cache_free_gpu_memory_fraction", "enable_block_reuse"})
    INSTALL = INSTALL
    METRICS = TRTLLM
    KV_HOW = KV_HOW

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        self._model_dtype: str | None = None  # trtllm_model_config_info's dtype label, read at start

    def server_argv(self) -> list[str]:
        s = self.server
        args: list[str] = [s.model_arg, "--host", s.host, "--port", s.port]
        for k in FLAGS:
            if self.options.get(k) is not None:
                args += ["--" + k, str(self.options[k])]
        path = Path(s.work_dir) / "llm_api_options.yaml"
        path.write_text(json.dumps(llm_api_options(self.options, self.dtype), indent=2) + "\n")  # JSON is YAML
        return s.argv(script="trtllm-serve", args=[*args, "--extra_llm_api_options", str(path)],
                      container_cmd=["trtllm-serve"])

    def token_id_fields(self) -> dict[str, Any]:
        """trtllm-serve streams each chunk's new ids in `token_ids` only with `detokenize: false`
        (and forbids `return_token_ids`, which it does not know)."""
        return {"detokenize": False} if self.options.get("return_token_ids", True) else {}

    def _knobs(self) -> dict[str, Any]:
        extra = llm_api_options(self.options, self.dtype) if self.mode == "server" else {}
        return {**super()._knobs(), **{k: self.options[k] for k in FLAGS if k in self.options}, **extra}

    async def _capacity(self) -> tuple[int | None, int | None]:
        """The KV gauges are iteration stats, published by a background task after iterations
        ran (the start-up probe ran some): poll a few seconds for them."""
        deadline = time.monotonic() + CAPACITY_WAIT_S
        while True:
            cap, bs = await super()._capacity()
            if cap is not None or not self._has_metrics or time.monotonic() > deadline:
                return cap, bs
            await asyncio.sleep(0.5)

    def _dtype_ran(self) -> str:
        """The `dtype` label of trtllm_model_config_info when the server publishes it."""
        return self._model_dtype or self.dtype

    def _unhonoured(self, capacity: int | None, block_size: int | None) -> dict[str, str]:
        out = super()._unhonoured(capacity, block_size)
        ran = self._dtype_ran()
        if ran != self.dtype:
            out["dtype"] = f"trtllm: {self.dtype} was asked, the server reports dtype {ran}"
        return out

    async def _scrape(self, first: bool = False) -> prom.Metrics | None:
        m = await super()._scrape(first)
        if first and m is not None:
            labels = m.labels(*self.METRICS.model_info) or {}
            dtype = labels.get("dtype")
            self._model_dtype = dtype if dtype not in (None, "", "auto") else None
        return m

    async def reset_prefix_cache(self) -> bool:
        return False  # trtllm-serve has no route for it


class TRTLLMInProcess(HeldEngine):
    name = "trtllm"
    OPTIONS = frozenset({"kv_cache_tokens", "enable_block_reuse", "kv_cache_free_gpu_memory_fraction", *FLAGS})

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        self.info: EngineInfo | None = None
        self._streams: dict[str, Any] = {}

    async def start(self) -> EngineInfo:
        trt = need("tensorrt_llm", INSTALL)
        from tensorrt_llm.llmapi import KvCacheConfig

        opts = llm_api_options(self.options, self.dtype)
        kw = {k: self.options[k] for k in ("max_batch_size", "max_num_tokens", "max_seq_len") if k in self.options}
        self.engine = trt.LLM(model=self.model, dtype=self.dtype, kv_cache_config=KvCacheConfig(**opts.get(
            "kv_cache_config", {})), **kw)
        # The LLM API reports no capacity here: a budget (an upper bound) cannot be confirmed.
        gap = kv_pin_gap(self.options.get("kv_cache_tokens"), None, None, self.name, KV_HOW)
        self.info = EngineInfo(engine=self.name, version=getattr(trt, "__version__", "unknown"), model=self.model,
                               dtype=self.dtype, kv_capacity_tokens=None, knobs=dict(self.options),
                               mode="in_process", unhonoured={"kv_cache_tokens": gap} if gap else {})
        return self.info

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        from tensorrt_llm import SamplingParams

        s, rid = request.sampling, request.request_id
        sp = SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                            top_k=s.top_k if s.top_k and s.top_k > 0 else None, ignore_eos=s.ignore_eos,
                            stop=list(s.stop) or None, seed=s.seed)
        stream = self.engine.generate_async(list(request.prompt_token_ids), sp, streaming=True)
        self._streams[rid] = stream
        try:
            async for out in stream:
                recv_ns = time.perf_counter_ns()
                c = out.outputs[0]
                ids, text = list(c.token_ids_diff), c.text_diff
                if out.finished:
                    yield TokenEvent(rid, ids, text, recv_ns, True, c.finish_reason or "abort",
                                     len(request.prompt_token_ids), len(c.token_ids))
                    return
                if ids:
                    yield TokenEvent(rid, ids, text, recv_ns)
        finally:
            self._streams.pop(rid, None)

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.abort()
