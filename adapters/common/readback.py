"""What an engine says it runs with (`EngineInfo.effective`) and how it split its memory
(`EngineInfo.memory`), collected from the engine's own reports, never from our options.

`ReadBack` gathers both: each `put(key, value, source)` records a setting and where it was read
(the first source that knows a key wins; None means "this source does not say"), `mem(key,
bytes, source)` a memory figure. `result()` gives `(effective, memory)` with
`effective["sources"]` naming the source of every key, memory keys included (as "memory.KEY").

The vLLM readers live here because `inferlab serve` exports vLLM's shapes too (its
`vllm:cache_config_info`), so the vLLM and reference server adapters share them:
- `vllm_server_info(cfg)`: vLLM's `GET /server_info?config_format=json` (routes of
  `VLLM_SERVER_DEV_MODE=1`), the resolved `VllmConfig` as JSON;
- `vllm_cache_labels(labels)`: the `vllm:cache_config_info` labels at /metrics;
- `vllm_log(text)`: the server's startup log ("Initializing a V1 LLM engine (vX) with config:
  ...", "<device> KV cache size: N tokens", and the memory lines "Model loading took X GiB",
  "Available KV cache memory: X GiB", "Graph capturing finished in N secs, took X GiB",
  CPU: "Explicitly set (X/Y) GiB for KV cache"). Log figures are GiB rounded to 0.01 by vLLM,
  so the bytes derived from them carry that resolution and their source says so.
The exact shapes are recorded in tests/adapters/fixtures/vllm/SOURCE.md.
"""
from __future__ import annotations

import re
import shlex
from typing import Any

import httpx

from adapters.transport.prom import Metrics, as_int

GIB = 1 << 30
EFFECTIVE_KEYS = ("dtype", "kv_capacity_tokens", "kv_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                  "max_model_len", "chunked_prefill", "prefix_caching", "cuda_graphs", "compile", "speculative",
                  "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "seeded_sampling",
                  "launch_command")
MEMORY_KEYS = ("weights", "kv_allocated", "kv_peak_used", "device_total", "graph_pool", "kv_bytes_per_token")


class ReadBack:
    """Settings and memory figures read from an engine, each with its source (first one wins)."""

    def __init__(self) -> None:
        self.effective: dict[str, Any] = {}
        self.memory: dict[str, int] = {}
        self.sources: dict[str, str] = {}

    def put(self, key: str, value: Any, source: str) -> None:
        if value is not None and key not in self.effective:
            self.effective[key] = value
            self.sources[key] = source

    def mem(self, key: str, value: int | float | None, source: str) -> None:
        if value is not None and key not in self.memory:
            self.memory[key] = int(value)
            self.sources["memory." + key] = source

    def has(self, key: str) -> bool:
        return key in self.effective

    def result(self) -> tuple[dict[str, Any], dict[str, int]]:
        return {**self.effective, "sources": dict(self.sources)}, dict(self.memory)


def launch_command(argv: list[str] | None) -> str | None:
    """The argv a launched server ran, shell-quoted (None: not launched by us)."""
    return shlex.join(str(a) for a in argv) if argv else None


def as_bool(label: Any) -> bool | None:
    """"True"/"False" (any case), a bool, or None."""
    if isinstance(label, bool):
        return label
    text = str(label).strip().lower() if label is not None else ""
    return {"true": True, "false": False, "1": True, "0": False}.get(text)


def torch_dtype(name: Any) -> str | None:
    """'torch.float32' / 'float32' / 'torch.bfloat16' -> 'float32' / 'bfloat16' (None stays None)."""
    if name in (None, "", "auto", "None"):
        return None
    return str(name).removeprefix("torch.")


def gib_bytes(text: str) -> int:
    """A vLLM log figure in GiB ('0.01', '12.3') as bytes (keeps the log's 0.01 GiB resolution)."""
    return round(float(text) * GIB)


# -- vLLM ---------------------------------------------------------------------------------

def per_token_bytes(rb: ReadBack) -> None:
    """memory.kv_bytes_per_token = kv_allocated / kv_capacity_tokens, when the bytes are exact (not a
    rounded log figure) and divide evenly (else the budget is shared, e.g. with a draft model's KV)."""
    cap, kv = rb.effective.get("kv_capacity_tokens"), rb.memory.get("kv_allocated")
    exact = "resolution" not in rb.sources.get("memory.kv_allocated", "resolution")
    if exact and cap and kv and kv % cap == 0:
        rb.mem("kv_bytes_per_token", kv // cap, "kv_allocated / kv_capacity_tokens (both the engine's)")


def vllm_speculative(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """vLLM's resolved speculative config reduced to the uniform keys (None: speculation off)."""
    if not spec or not spec.get("method"):
        return None
    out = {"method": spec["method"], "num_speculative_tokens": spec.get("num_speculative_tokens")}
    if spec["method"] == "ngram":
        out.update(prompt_lookup_min=spec.get("prompt_lookup_min"), prompt_lookup_max=spec.get("prompt_lookup_max"))
    elif spec.get("model") and spec.get("model") != spec["method"]:
        out["model"] = spec["model"]
    return out


def vllm_server_info(rb: ReadBack, cfg: dict[str, Any], source: str = "/server_info?config_format=json") -> None:
    """Settings from vLLM's resolved config (the `vllm_config` object of /server_info)."""
    model, cache = cfg.get("model_config") or {}, cfg.get("cache_config") or {}
    sched, par = cfg.get("scheduler_config") or {}, cfg.get("parallel_config") or {}
    comp = cfg.get("compilation_config") or {}
    blocks, bs = as_int(cache.get("num_gpu_blocks")), as_int(cache.get("block_size"))
    rb.put("dtype", torch_dtype(model.get("dtype")), source + " model_config.dtype")
    rb.put("kv_capacity_tokens", as_int(cache.get("kv_cache_size_tokens")) or (blocks * bs if blocks and bs else None),
           source + " cache_config")
    rb.put("kv_blocks", blocks, source + " cache_config.num_gpu_blocks")
    rb.put("block_size", bs, source + " cache_config.block_size")
    rb.put("max_num_seqs", as_int(sched.get("max_num_seqs")), source + " scheduler_config")
    rb.put("max_num_batched_tokens", as_int(sched.get("max_num_batched_tokens")), source + " scheduler_config")
    rb.put("max_model_len", as_int(model.get("max_model_len")), source + " model_config")
    rb.put("chunked_prefill", as_bool(sched.get("enable_chunked_prefill")), source + " scheduler_config")
    rb.put("prefix_caching", as_bool(cache.get("enable_prefix_caching")), source + " cache_config")
    if "cudagraph_mode" in comp:  # CUDAGraphMode.NONE is 0 (or "NONE" in older dumps)
        rb.put("cuda_graphs", comp["cudagraph_mode"] not in (0, "NONE", None),
               source + " compilation_config.cudagraph_mode")
    if "mode" in comp:  # CompilationMode.NONE is 0
        rb.put("compile", comp["mode"] not in (0, "NONE", None), source + " compilation_config.mode")
    if "speculative_config" in cfg:
        rb.put("speculative", vllm_speculative(cfg["speculative_config"]) or False, source + " speculative_config")
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        rb.put(key, as_int(par.get(key)), source + " parallel_config")
    rb.mem("kv_allocated", as_int(cache.get("kv_cache_memory_bytes")), source + " cache_config.kv_cache_memory_bytes")


def vllm_cache_labels(rb: ReadBack, labels: dict[str, str] | None,
                      source: str = "vllm:cache_config_info labels") -> None:
    """KV geometry and the prefix-cache switch from the labels of `vllm:cache_config_info`."""
    if not labels:
        return
    blocks, bs = as_int(labels.get("num_gpu_blocks")), as_int(labels.get("block_size"))
    rb.put("kv_capacity_tokens", as_int(labels.get("kv_cache_size_tokens")) or (blocks * bs if blocks and bs else None),
           source)
    rb.put("kv_blocks", blocks, source)
    rb.put("block_size", bs, source)
    rb.put("prefix_caching", as_bool(labels.get("enable_prefix_caching")), source)
    rb.mem("kv_allocated", as_int(labels.get("kv_cache_memory_bytes")), source + " (kv_cache_memory_bytes)")


ENGINE_LINE = re.compile(r"Initializing a V1 LLM engine \(v[^)]*\) with config: (.*)")
LOG_FIELDS = {  # key -> (pattern in the engine config line, converter)
    "dtype": (r"\bdtype=torch\.(\w+)", str),
    "max_model_len": (r"\bmax_seq_len=(\d+)", int),
    "tensor_parallel_size": (r"\btensor_parallel_size=(\d+)", int),
    "pipeline_parallel_size": (r"\bpipeline_parallel_size=(\d+)", int),
    "data_parallel_size": (r"\bdata_parallel_size=(\d+)", int),
    "prefix_caching": (r"\benable_prefix_caching=(True|False)", as_bool),
    "chunked_prefill": (r"\benable_chunked_prefill=(True|False)", as_bool),
    "cuda_graphs": (r"'cudagraph_mode': <CUDAGraphMode\.(\w+)", lambda m: m != "NONE"),
    "compile": (r"'mode': <CompilationMode\.(\w+)", lambda m: m != "NONE"),
}
SPEC_IN_LOG = re.compile(r"speculative_config=(None|SpeculativeConfig\(method='([^']*)', model=(None|'[^']*'), "
                         r"num_spec_tokens=(\d+)\))")
LOG_MEMORY = {  # memory key -> pattern with the GiB figure
    "weights": re.compile(r"Model loading took ([\d.]+) GiB memory"),
    "kv_allocated": re.compile(r"Available KV cache memory: ([\d.]+) GiB"
                               r"|Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache"),
    "graph_pool": re.compile(r"Graph capturing finished in \d+ secs, took ([\d.]+) GiB"),
}
KV_TOKENS_LOG = re.compile(r"\b\w+ KV cache size: ([\d,]+) tokens")


def vllm_log(rb: ReadBack, text: str, source: str = "startup log") -> None:
    """Settings and memory figures from a vLLM server's startup log (the last engine's lines)."""
    lines = ENGINE_LINE.findall(text)
    if lines:
        line, where = lines[-1], source + ": engine config line"
        for key, (pattern, conv) in LOG_FIELDS.items():
            m = re.search(pattern, line)
            rb.put(key, conv(m.group(1)) if m else None, where)
        m = SPEC_IN_LOG.search(line)
        if m:
            spec = None if m.group(1) == "None" else {"method": m.group(2), "num_speculative_tokens": int(m.group(4))}
            if spec and m.group(3) != "None" and spec["method"] != "ngram":
                spec["model"] = m.group(3).strip("'")
            rb.put("speculative", spec or False, where)
    tokens = KV_TOKENS_LOG.findall(text)
    rb.put("kv_capacity_tokens", int(tokens[-1].replace(",", "")) if tokens else None, source + ": KV cache size line")
    for key, pattern in LOG_MEMORY.items():
        found = pattern.findall(text)
        if found:
            last = found[-1]
            figure = next(g for g in last if g) if isinstance(last, tuple) else last
            rb.mem(key, gib_bytes(figure), source + " (GiB, 0.01 resolution)")


async def server_info_json(client: httpx.AsyncClient) -> dict[str, Any]:
    """`GET /server_info?config_format=json` as a dict ({} when the server has no such route)."""
    try:
        resp = await client.get("/server_info", params={"config_format": "json"})
        info = resp.json() if resp.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        info = {}
    return info if isinstance(info, dict) else {}


def vllm_shapes(rb: ReadBack, info: dict[str, Any], metrics: Metrics | None, cache_info: tuple[str, ...]) -> None:
    """vLLM's resolved config in a /server_info answer (when it has `vllm_config`), then the
    cache_config_info labels of a scrape."""
    if isinstance(info.get("vllm_config"), dict):
        vllm_server_info(rb, info["vllm_config"])
    vllm_cache_labels(rb, metrics.labels(*cache_info) if metrics is not None else None)


# The source of a setting an engine does not report: the row shows what we asked, labelled so.
AS_REQUESTED = "as requested — the engine does not report it"
