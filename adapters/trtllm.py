"""TensorRT-LLM: `trtllm-serve` (OpenAI routes) launched or attached, or `tensorrt_llm.LLM` in-process.

- Server: `trtllm-serve MODEL --host H --port P [--kv_cache_free_gpu_memory_fraction F]
  [--extra_llm_api_options WORK/llm_api_options.yaml]`; streaming, token-id prompts and
  usage come from `adapters.openai_compat.OpenAIEngine` (the probe at start records whether
  its chunks carry token ids; if not, each chunk counts one `UNKNOWN_TOKEN_ID`).
- Metrics: Prometheus text lives at `/prometheus/metrics` (`/metrics` is a JSON stats
  endpoint that is drained on read, so it is never scraped). KV capacity =
  `trtllm_kv_cache_max_blocks x trtllm_kv_cache_tokens_per_block`; usage
  `trtllm_kv_cache_utilization`; running / waiting `trtllm_num_requests_running|waiting`.
- `kv_cache_tokens` is pinned through `kv_cache_config.max_tokens` in the LLM-API options
  file (JSON, which YAML parsers read). Memory knob semantics differ from vLLM's: TRT-LLM's
  fraction is of the memory *free after weights*.
- In-process: `tensorrt_llm.LLM(...).generate_async(ids, sampling, streaming=True)`; its
  outputs are cumulative, and `token_ids_diff` / `text_diff` give the new part.
The PyPI package `tensorrt-llm` is a stub that fetches wheels from NVIDIA's index and
needs CUDA: it is imported only in `start()`.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, AsyncIterator

from adapters import prom
from adapters.base import Engine, EngineInfo, GenerationRequest, MemorySnapshot, TokenEvent, check_options
from adapters.openai_launched import LaunchedOpenAIEngine
from adapters.serving import ModalEngine, need

INSTALL = ("pip install tensorrt-llm --extra-index-url https://pypi.nvidia.com on a CUDA host "
           "(or launcher = \"docker run --gpus all ... nvcr.io/nvidia/tensorrt-llm/release:TAG\")")
KNOBS = ("kv_cache_free_gpu_memory_fraction", "max_batch_size", "max_num_tokens", "max_seq_len", "tp_size", "backend")


def llm_api_options(options: dict[str, Any]) -> dict[str, Any]:
    """The LLM-API options these adapter options ask for (empty when nothing is pinned)."""
    kv: dict[str, Any] = {}
    if options.get("kv_cache_tokens") is not None:
        kv["max_tokens"] = int(options["kv_cache_tokens"])
    if options.get("enable_block_reuse") is not None:
        kv["enable_block_reuse"] = bool(options["enable_block_reuse"])
    return {"kv_cache_config": kv} if kv else {}


class TRTLLMEngine(ModalEngine):
    name = "trtllm"
    IMPLS = {"server": "adapters.trtllm:TRTLLMServer", "attach": "adapters.trtllm:TRTLLMServer",
             "in_process": "adapters.trtllm:TRTLLMInProcess"}


class TRTLLMServer(LaunchedOpenAIEngine):
    name = "trtllm"
    OPTIONS = LaunchedOpenAIEngine.OPTIONS | set(KNOBS) | {"enable_block_reuse"}
    INSTALL = INSTALL
    METRICS = {"kv_usage": ("trtllm_kv_cache_utilization",), "running": ("trtllm_num_requests_running",),
               "waiting": ("trtllm_num_requests_waiting",), "cache_info": ()}

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        self.metrics_path = self.options.get("metrics_path", "/prometheus/metrics")

    def server_argv(self) -> list[str]:
        s = self.server
        args: list[str] = [s.model_arg, "--host", s.host, "--port", s.port]
        for k in KNOBS:
            if self.options.get(k) is not None:
                args += ["--" + k, str(self.options[k])]
        extra = llm_api_options(self.options)
        if extra:
            path = Path(s.work_dir) / "llm_api_options.yaml"
            path.write_text(json.dumps(extra, indent=2) + "\n")  # JSON is valid YAML
            args += ["--extra_llm_api_options", str(path)]
        return s.argv(script="trtllm-serve", args=args, container_cmd=["trtllm-serve"])

    def _knobs(self) -> dict[str, Any]:
        return {**super()._knobs(), **{k: self.options[k] for k in KNOBS if k in self.options},
                **llm_api_options(self.options)}

    def _kv_capacity(self, m: prom.Metrics | None) -> tuple[int | None, int | None]:
        blocks = m.value("trtllm_kv_cache_max_blocks") if m else None
        per = m.value("trtllm_kv_cache_tokens_per_block") if m else None
        if blocks is None or not per:
            return None, int(per) if per else None
        return int(blocks) * int(per), int(per)

    async def reset_prefix_cache(self) -> bool:
        return False  # trtllm-serve has no route for it


class TRTLLMInProcess(Engine):
    name = "trtllm"
    OPTIONS = frozenset({"kv_cache_tokens", "enable_block_reuse", *KNOBS})

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        self.llm: Any = None
        self.info: EngineInfo | None = None
        self._streams: dict[str, Any] = {}

    async def start(self) -> EngineInfo:
        trt = need("tensorrt_llm", INSTALL)
        from tensorrt_llm.llmapi import KvCacheConfig

        kv = llm_api_options(self.options).get("kv_cache_config", {})
        if self.options.get("kv_cache_free_gpu_memory_fraction") is not None:
            kv["free_gpu_memory_fraction"] = float(self.options["kv_cache_free_gpu_memory_fraction"])
        kw = {k: self.options[k] for k in ("max_batch_size", "max_num_tokens", "max_seq_len") if k in self.options}
        self.llm = trt.LLM(model=self.model, dtype=self.dtype, kv_cache_config=KvCacheConfig(**kv), **kw)
        self.info = EngineInfo(engine=self.name, version=getattr(trt, "__version__", "unknown"), model=self.model,
                               dtype=self.dtype, kv_capacity_tokens=kv.get("max_tokens"), knobs=dict(self.options),
                               mode="in_process")
        return self.info

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        from tensorrt_llm import SamplingParams

        s, rid = request.sampling, request.request_id
        sp = SamplingParams(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                            top_k=s.top_k if s.top_k and s.top_k > 0 else None, ignore_eos=s.ignore_eos,
                            stop=list(s.stop) or None, seed=s.seed)
        stream = self.llm.generate_async(list(request.prompt_token_ids), sp, streaming=True)
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

    async def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(t_ns=time.perf_counter_ns())

    async def stop(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.shutdown()
