"""TensorRT-LLM: `trtllm-serve` (OpenAI routes) launched or attached, or `tensorrt_llm.LLM` in-process.

Facts this adapter relies on were read at the pinned tag v1.3.0rc24 (commit 1cef02e9) and are
recorded in adapters/engines/trtllm/upstream.json (the dry run checks against it); how each was read, and
the few that could only be read near the tag: tests/adapters/fixtures/trtllm/SOURCE.md.

- Server: `trtllm-serve MODEL --host H --port P [--backend B] [--max_batch_size N] ...
  --extra_llm_api_options WORK/llm_api_options.yaml` (newer releases also call it `--config`).
  trtllm-serve has no `--dtype` flag: the dtype goes in the options file as the LLM-API field
  `dtype`, and the file also turns on what the harness needs: `return_perf_metrics: true`
  (without it there is no Prometheus text at `/prometheus/metrics`), `enable_chunked_prefill:
  true` (trtllm-serve's default is off; vLLM and SGLang chunk by default) and, on the PyTorch
  backend only, `enable_iter_perf_stats: true` (without it the KV and queue gauges stay empty;
  the field is TorchLlmArgs' and BaseLlmArgs forbids unknown fields, so the TensorRT backend,
  whose iteration stats always run, must not get it). Keys per backend: `BACKEND_KEYS`.
- The file's `kv_cache_config` *replaces* the one trtllm-serve builds from its command line
  (top-level merge), so `kv_cache_free_gpu_memory_fraction` goes into the file too, never on
  the command line. `kv_cache_tokens` becomes `kv_cache_config.max_tokens`, which is an upper
  bound (TRT-LLM uses the minimum of it and what the free-memory fraction allows): the
  capacity read back from `trtllm_kv_cache_max_blocks x trtllm_kv_cache_tokens_per_block`
  decides whether the budget was honoured (`EngineInfo.unhonoured` says when not).
- Requests: trtllm-serve's request models forbid unknown fields (HTTP 400), so vLLM's
  `return_token_ids` is never sent; token ids stream only with `detokenize: false`, and then
  every chunk's text is empty. Stop strings still stop generation then: TRT-LLM tokenizes each
  stop string alone (`SamplingParams._setup`) and the runtime matches those id sequences, not
  text, so a stop string that the model emits with other token boundaries is missed (the
  knob `stop_strings` says so in every report).
- `/metrics` is a JSON iteration-stats endpoint that is drained on read: never scraped.
- Features (adapters.common.features), in the options file: `enable_prefix_caching` ->
  `kv_cache_config.enable_block_reuse` (TRT-LLM's prefix reuse, default on; option
  `enable_block_reuse` is the same switch); `speculative_config` ngram -> `speculative_config:
  {decoding_type: NGram, max_draft_len: k, max_matching_ngram_size: prompt_lookup_max,
  is_public_pool: false}` (a pool per request, as vLLM looks only at the request's own tokens;
  TRT-LLM tries every match length from max down to 1, so a prompt_lookup_min above 1 is
  unhonoured), draft_model -> `{decoding_type: Draft_Target, max_draft_len: k, speculative_model:
  DIR}`. Both run on the PyTorch backend only (`supports_backend`).
- `EngineInfo.effective` from /prometheus/metrics: `trtllm_model_config_info` (max_model_len;
  its dtype label is `str(args.dtype)`, the argument, so the dtype row is labelled as requested),
  `trtllm_parallel_config_info`, `trtllm_speculative_config_info`,
  `trtllm_kv_cache_config_info` (enable_block_reuse) where the server exports them (newer
  releases), the KV block gauges, `trtllm_max_num_active_requests`,
  `trtllm_max_num_tokens_runtime`. No memory split is exported (`EngineInfo.memory` stays empty).
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

from adapters.base import EngineInfo, GenerationRequest, TokenEvent, check_options
from adapters.common import features
from adapters.common.readback import AS_REQUESTED, ReadBack, as_bool, torch_dtype
from adapters.common.versions import Row, VersionTable, launcher_version
from adapters.transport import prom
from adapters.transport.metric_names import MetricNames
from adapters.transport.openai import OpenAIEngine
from adapters.transport.server import HeldEngine, LaunchedServer, kv_pin_gap, need

# The release container `inferlab list-engines`, the dry run and scripts/gpu_compare.sh name: the release
# VERSIONS below was read at (tests/adapters/test_versions.py keeps them in step).
IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24"

INSTALL = ("run TensorRT-LLM's release container (launcher = \"docker run --gpus all --ipc host --network host "
           f"-v {{model}}:{{model}} {IMAGE}\"), or on a CUDA host "
           "`apt-get install libopenmpi-dev && pip install tensorrt_llm==1.3.0rc24` (PyPI holds only a ~200 kB "
           "installer stub for it, which fetches the real wheel from NVIDIA's own index at install time)")
# trtllm-serve flags passed through: option name == --flag (underscores, as trtllm-serve spells them).
FLAGS = ("max_batch_size", "max_num_tokens", "max_seq_len", "tp_size", "pp_size", "backend")
KV_HOW = "kv_cache_config.max_tokens (an upper bound: TRT-LLM takes the minimum with the free-memory fraction)"
CAPACITY_WAIT_S = 10.0  # the KV gauges are iteration stats: they appear after the first iterations
NGRAM_MIN = ("TRT-LLM's NGram drafter tries every match length from max_matching_ngram_size down to 1; "
             "prompt_lookup_min {} has no TRT-LLM setting")
# info gauges (labels = settings) and plain gauges read back at start (tensorrt_llm/metrics/collector.py,
# serve/openai_server.py _log_config_info_metrics; see fixtures/trtllm/SOURCE.md)
PARALLEL_INFO, SPEC_INFO, KV_INFO = ("trtllm_parallel_config_info", "trtllm_speculative_config_info",
                                     "trtllm_kv_cache_config_info")
MAX_ACTIVE, MAX_TOKENS = "trtllm_max_num_active_requests", "trtllm_max_num_tokens_runtime"
SPEC_METHODS = {"NGram": "ngram", "Draft_Target": "draft_model"}
# Options-file keys per backend, all TorchLlmArgs fields at the pin (enable_iter_perf_stats is
# TorchLlmArgs' own). `trtllm-serve --backend` takes pytorch or _autodeploy at 1.3.0rc24: the TensorRT
# backend (TrtLlmArgs) is gone (adapters/engines/trtllm/upstream.json serve_flags, llm_args).
COMMON_KEYS = ("dtype", "return_perf_metrics", "enable_chunked_prefill", "kv_cache_config", "speculative_config")
BACKEND_KEYS = {"pytorch": COMMON_KEYS + ("enable_iter_perf_stats",)}
STOP_MATCH = ("token ids: TRT-LLM tokenizes each stop string alone and stops when the generated ids end with "
              "that sequence (text produced with other token boundaries does not stop it)")
# TensorRT-LLM trtllm-serve (tensorrt_llm/metrics/collector.py): Prometheus text at
# /prometheus/metrics, mounted only with the LLM-API option `return_perf_metrics: true`; the
# KV and queue gauges are iteration stats, filled only with `enable_iter_perf_stats: true`.
TRTLLM = MetricNames(
    engine="trtllm",
    path="/prometheus/metrics",
    kv_usage=("trtllm_kv_cache_utilization",),
    running=("trtllm_num_requests_running",),
    waiting=("trtllm_num_requests_waiting",),
    ttft="trtllm_time_to_first_token_seconds",
    tpot="trtllm_time_per_output_token_seconds",
    e2e="trtllm_e2e_request_latency_seconds",
    queue_time="trtllm_request_queue_time_seconds",  # metrics/collector.py (fixtures/trtllm/facts.json metrics)
    prompt_tokens=("trtllm_prompt_tokens_total",),
    generation_tokens=("trtllm_generation_tokens_total",),
    prefix_queries=("trtllm_prompt_tokens_total",),
    prefix_hits=("trtllm_prompt_cached_tokens_total",),
    spec_draft_tokens=("trtllm_spec_decode_num_draft_tokens_total",),
    spec_accepted_tokens=("trtllm_spec_decode_num_accepted_tokens_total",),
    kv_blocks=("trtllm_kv_cache_max_blocks",),
    kv_used_blocks=("trtllm_kv_cache_used_blocks",),
    kv_block_tokens=("trtllm_kv_cache_tokens_per_block",),
    model_info=("trtllm_model_config_info",),
    # the KV cache's block-reuse hit rate of the latest iteration stats (reused / allocated blocks)
    prefix_hit_rate=("trtllm_kv_cache_hit_rate",),
)

# The version this adapter's facts were checked for (adapters/engines/trtllm/upstream.json, read at the tag).
DTYPES = ("bfloat16", "float16")  # what the adapter launches; float32 is refused (check_dtype)
VERSIONS = VersionTable("trtllm", (Row("1.3.0rc24", "1.3.0rc24", ("1.3.0rc24",), {"metrics": TRTLLM}),))


def speculative_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The LLM-API `speculative_config` for a uniform one (adapters.common.features)."""
    k = spec["num_speculative_tokens"]
    if spec["method"] == "ngram":
        return {"decoding_type": "NGram", "max_draft_len": k, "max_matching_ngram_size": spec["prompt_lookup_max"],
                "is_public_pool": False}
    return {"decoding_type": "Draft_Target", "max_draft_len": k, "speculative_model": spec["model"]}


def check_dtype(dtype: str) -> None:
    """float32 is refused before launch: TensorRT-LLM's custom kernels do not support it
    (NVIDIA/TensorRT-LLM#5260; nothing in llm_args.py@v1.3.0rc24 refuses it, so it would fail at load)."""
    if dtype not in DTYPES:
        raise ValueError(f"engine 'trtllm': dtype {dtype!r} is not supported by TensorRT-LLM's kernels "
                         f"(NVIDIA/TensorRT-LLM#5260); use one of {', '.join(DTYPES)}")


def seq_len_option(options: dict[str, Any]) -> dict[str, Any]:
    """The harness's uniform `max_model_len` (experiments/workload/context.py) is trtllm-serve's --max_seq_len."""
    n = options.get("max_model_len")
    if n is None:
        return options
    if options.get("max_seq_len") not in (None, n):
        raise ValueError("engine 'trtllm': max_model_len and max_seq_len contradict each other; set one")
    return {**{k: v for k, v in options.items() if k != "max_model_len"}, "max_seq_len": int(n)}


def llm_api_options(options: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The LLM-API options file trtllm-serve gets (`--extra_llm_api_options`)."""
    kv: dict[str, Any] = {}
    if options.get("kv_cache_free_gpu_memory_fraction") is not None:
        kv["free_gpu_memory_fraction"] = float(options["kv_cache_free_gpu_memory_fraction"])
    if options.get("kv_cache_tokens") is not None:
        kv["max_tokens"] = int(options["kv_cache_tokens"])
    reuse = [options[k] for k in ("enable_block_reuse", "enable_prefix_caching") if options.get(k) is not None]
    if len(set(map(bool, reuse))) > 1:
        raise ValueError("engine 'trtllm': enable_block_reuse and enable_prefix_caching contradict each other")
    if reuse:
        kv["enable_block_reuse"] = bool(reuse[0])
    backend = options.get("backend") or "pytorch"
    if backend not in BACKEND_KEYS:
        raise ValueError(f"engine 'trtllm': backend {backend!r} is not one of {sorted(BACKEND_KEYS)}")
    out: dict[str, Any] = {"dtype": dtype, "return_perf_metrics": True, "enable_iter_perf_stats": True,
                           "enable_chunked_prefill": bool(options.get("enable_chunked_prefill", True))}
    spec = features.speculative("trtllm", options.get("speculative_config"))
    if spec is not None:
        if options.get("backend") not in (None, "pytorch"):
            raise ValueError(f"engine 'trtllm': speculative_config needs backend pytorch (TRT-LLM's NGram and "
                             f"Draft_Target decoding support no other), got {options['backend']!r}")
        out["speculative_config"] = speculative_config(spec)
    if kv:
        out["kv_cache_config"] = kv
    return {k: v for k, v in out.items() if k in BACKEND_KEYS[backend]}


def feature_unhonoured(options: dict[str, Any]) -> dict[str, str]:
    """What TRT-LLM cannot do of the uniform features asked (before any read-back)."""
    spec = features.speculative("trtllm", options.get("speculative_config"))
    if spec is not None and spec["method"] == "ngram" and spec["prompt_lookup_min"] > 1:
        return {"speculative_config.prompt_lookup_min": NGRAM_MIN.format(spec["prompt_lookup_min"])}
    return {}


def metrics_read_back(rb: ReadBack, m: prom.Metrics | None, source: str) -> None:
    """Settings from trtllm-serve's Prometheus text (the module docstring lists them)."""
    if m is None:
        return
    model = m.labels("trtllm_model_config_info") or {}
    rb.put("dtype", torch_dtype(model.get("dtype")),
           f"{AS_REQUESTED} ({source} trtllm_model_config_info dtype is str(args.dtype), the argument)")
    rb.put("max_model_len", prom.as_int(model.get("max_model_len")), source + " trtllm_model_config_info")
    par = m.labels(PARALLEL_INFO)
    if par is not None:
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            rb.put(key, prom.as_int(par.get(key)), source + " " + PARALLEL_INFO)
        spec = m.labels(SPEC_INFO)  # logged in the same call as the parallel one, only with speculation on
        if spec is None:
            rb.put("speculative", False, source + f" no {SPEC_INFO} beside {PARALLEL_INFO}")
        else:
            out = {"method": SPEC_METHODS.get(spec.get("spec_method"), spec.get("spec_method")),
                   "num_speculative_tokens": prom.as_int(spec.get("spec_num_tokens"))}
            if spec.get("spec_draft_model"):
                out["model"] = spec["spec_draft_model"]
            rb.put("speculative", out, source + " " + SPEC_INFO)
    kv = m.labels(KV_INFO) or {}
    rb.put("prefix_caching", as_bool(kv.get("enable_block_reuse")), source + f" {KV_INFO} enable_block_reuse")
    blocks = m.value(*TRTLLM.kv_blocks)
    rb.put("kv_blocks", int(blocks) if blocks else None, source + " " + TRTLLM.kv_blocks[0])
    for key, name in (("max_num_seqs", MAX_ACTIVE), ("max_num_batched_tokens", MAX_TOKENS)):
        v = m.value(name)
        rb.put(key, int(v) if v else None, f"{source} {name}")


class TRTLLMServer(LaunchedServer, OpenAIEngine):
    VERSIONS = VERSIONS  # the version table (its contract.py reads it from the adapter)
    OPTIONS = (OpenAIEngine.OPTIONS | LaunchedServer.OPTIONS | set(FLAGS)
               | {"kv_cache_free_gpu_memory_fraction", "enable_block_reuse", "max_model_len", "enable_chunked_prefill"})

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_dtype(dtype)
        self.options = seq_len_option(self.options)
        llm_api_options(self.options, dtype)  # checked at construction
        self._model_dtype: str | None = None  # trtllm_model_config_info's dtype label, read at start
    INSTALL = INSTALL
    METRICS = TRTLLM
    KV_HOW = KV_HOW

    def server_argv(self) -> list[str]:
        s = self.server
        found = launcher_version(s.launcher, "tensorrt_llm") if s.launcher else None
        if found:
            VERSIONS.row(found)  # refuses a version outside the table before anything starts
        args: list[str] = [s.model_arg, "--host", s.host, "--port", s.port]
        for k in FLAGS:
            if self.options.get(k) is not None:
                args += ["--" + k, str(self.options[k])]
        return s.argv(script="trtllm-serve", args=[*args, "--extra_llm_api_options", str(self.options_path())],
                      container_cmd=["trtllm-serve"])

    def options_path(self) -> Path:
        return Path(self.server.work_dir) / "llm_api_options.yaml"  # mounted into a container launcher

    def server_files(self) -> dict[str, str]:
        return {str(self.options_path()): json.dumps(llm_api_options(self.options, self.dtype), indent=2) + "\n"}

    def token_id_fields(self) -> dict[str, Any]:
        """trtllm-serve streams each chunk's new ids in `token_ids` only with `detokenize: false`
        (and forbids `return_token_ids`, which it does not know)."""
        return {"detokenize": False} if self.options.get("return_token_ids", True) else {}

    def _completion_body(self, request: GenerationRequest) -> dict[str, Any]:
        """On the chat route there is no `detokenize` (ChatCompletionRequest forbids unknown
        fields: every request would get HTTP 400) and no token ids in the stream, so the
        tokens are counted from the running usage (`continuous_usage_stats`)."""
        body = super()._completion_body(request)
        if request.messages is not None:
            body.pop("detokenize", None)
            body["stream_options"]["continuous_usage_stats"] = True
        return body

    def _knobs(self) -> dict[str, Any]:
        extra = llm_api_options(self.options, self.dtype) if self.mode == "server" else {}
        return {**super()._knobs(), **{k: self.options[k] for k in FLAGS if k in self.options}, **extra,
                "stop_strings": STOP_MATCH}

    async def _version(self) -> str:
        """/version, refused (EngineUnavailable) when no row of VERSIONS covers it."""
        version = await super()._version()
        VERSIONS.row(None if version == "unknown" else version)
        return version

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

    async def _engine_read_back(self, rb: ReadBack) -> None:
        metrics_read_back(rb, self._first_metrics, self.metrics_path)
        if self.mode == "server":  # no info gauge or route reports it: what the options file set
            rb.put("chunked_prefill", llm_api_options(self.options, self.dtype)["enable_chunked_prefill"],
                   AS_REQUESTED + " (enable_chunked_prefill in the options file; trtllm-serve exports no such setting)")

    def _unhonoured(self, capacity: int | None, block_size: int | None) -> dict[str, str]:
        out = {**super()._unhonoured(capacity, block_size), **feature_unhonoured(self.options)}
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
    OPTIONS = frozenset({"kv_cache_tokens", "enable_block_reuse", "kv_cache_free_gpu_memory_fraction", *FLAGS,
                         "max_model_len", "enable_chunked_prefill", *features.OPTIONS})

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        check_dtype(dtype)
        self.options = seq_len_option(self.options)
        self.info: EngineInfo | None = None
        self._streams: dict[str, Any] = {}

    async def start(self) -> EngineInfo:
        trt = need("tensorrt_llm", INSTALL)
        VERSIONS.row(getattr(trt, "__version__", None))  # refuses a version outside the table
        from tensorrt_llm.llmapi import KvCacheConfig

        opts = llm_api_options(self.options, self.dtype)
        kw = {k: self.options[k] for k in ("max_batch_size", "max_num_tokens", "max_seq_len") if k in self.options}
        kw.update({arg: self.options[k] for k, arg in (("tp_size", "tensor_parallel_size"),
                                                        ("pp_size", "pipeline_parallel_size")) if k in self.options})
        if "speculative_config" in opts:  # the LLM API takes the same dict the options file holds
            kw["speculative_config"] = opts["speculative_config"]
        kw["enable_chunked_prefill"] = opts["enable_chunked_prefill"]
        self.engine = trt.LLM(model=self.model, dtype=self.dtype, kv_cache_config=KvCacheConfig(**opts.get(
            "kv_cache_config", {})), **kw)
        # The LLM API reports no capacity here: a budget (an upper bound) cannot be confirmed.
        gap = kv_pin_gap(self.options.get("kv_cache_tokens"), None, None, self.name, KV_HOW)
        unhonoured = {"kv_cache_tokens": gap} if gap else {}
        # the LLM API reports nothing of what it runs: every feature asked is unconfirmed
        unhonoured.update({**features.gaps(self.name, self.options, {}), **feature_unhonoured(self.options)})
        self.info = EngineInfo(engine=self.name, version=getattr(trt, "__version__", "unknown"), model=self.model,
                               dtype=self.dtype, kv_capacity_tokens=None, knobs=dict(self.options),
                               mode="in_process", unhonoured=unhonoured,
                               effective={"dtype": self.dtype, "chunked_prefill": opts["enable_chunked_prefill"],
                                          "sources": {"dtype": AS_REQUESTED + " (tensorrt_llm.LLM(dtype=...))",
                                                      "chunked_prefill": AS_REQUESTED}})
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
