"""SGLang's settings, both ways: the launch flags for the uniform features (prefix caching,
speculation; adapters.common.features) and what the server reports back at /server_info, read into
`EngineInfo.effective` / `.memory` (every key checked against SGLang 0.5.23's ServerArgs by
tests/adapters/test_sglang_contract.py; see adapters/engines/sglang/adapter.py for the whole adapter)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from adapters.common import features
from adapters.common.readback import AS_REQUESTED, GIB, ReadBack, as_bool, launch_command
from adapters.common.versions import Row, VersionTable
from adapters.transport.metric_names import MetricNames

# The container image `inferlab list-engines`, the dry run and scripts/gpu_compare.sh name: the release
# every row below was last checked against (tests/adapters/test_versions.py keeps them in step).
IMAGE = "lmsysorg/sglang:v0.5.23-cu130"

# SGLang 0.5.22-0.5.23's Prometheus names, python/sglang/srt/observability/metrics_collector.py (needs --enable-metrics);
# checked against the installed package by tests/adapters/sglang_contract.py. Older releases register
# a subset (no TPOT histogram before 0.5.22, no spec_verify_calls_total before 0.5.13): their rows are
# VERSIONS below, checked per release by tests/adapters/test_sglang_versions.py. A
# name a release does not register is simply absent from its /metrics, so this newest row reads an
# older server correctly too (the missing TPOT stays missing rather than being misread).
SGLANG = MetricNames(
    engine="sglang",
    kv_usage=("sglang:token_usage",),
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    tpot="sglang:request_time_per_output_token_seconds",
    e2e="sglang:e2e_request_latency_seconds",
    queue_time="sglang:queue_time_seconds",  # every release of the table registers it (metric_names_by_version.json)
    prompt_tokens=("sglang:prompt_tokens_total",),
    generation_tokens=("sglang:generation_tokens_total",),
    prefix_queries=("sglang:prompt_tokens_total",),  # every prompt token is looked up in the radix cache
    prefix_hits=("sglang:cached_tokens_total",),  # labelled by source (device/host/storage): summed
    spec_drafts=("sglang:spec_verify_calls_total",),  # SGLang counts verify steps, not draft/accepted tokens
    preemptions=("sglang:num_retracted_requests_total",),  # requests retracted when the KV pool ran out
    kv_capacity=("sglang:max_total_num_tokens",),
    kv_used=("sglang:num_used_tokens",),
    # Rates of the latest window only (scheduler_components/metrics_reporter.py): cache_hit_rate is
    # hit / (hit + new) prompt tokens of the last logged prefill batch; spec_accept_rate is accepted
    # drafts / (verify steps x (speculative_num_draft_tokens - 1)) and spec_accept_length accepted + 1
    # per verify step, both over the last decode_log_interval (default 40) decode steps.
    prefix_hit_rate=("sglang:cache_hit_rate",),
    spec_accept_rate=("sglang:spec_accept_rate",),
    spec_accept_length=("sglang:spec_accept_length",),
)


# Launch flags and metric names per SGLang release, each row checked against the source of the
# releases it lists (fixtures/sglang/SOURCE.md). The argument-groups refactor brought
# --cuda-graph-backend-{decode,prefill} in 0.5.14 (0.5.23 calls --disable-cuda-graph deprecated);
# the per-request TPOT histogram exists from 0.5.22; spec_verify_calls_total from 0.5.13.
GRAPHS_OFF_OLD = ["--disable-cuda-graph"]
GRAPHS_OFF = ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
_NO_TPOT = replace(SGLANG, tpot=None)
VERSIONS = VersionTable("sglang", (
    Row("0.5.9", "0.5.12", ("0.5.9", "0.5.10", "0.5.11", "0.5.12"),
        {"graphs_off": GRAPHS_OFF_OLD, "metrics": replace(_NO_TPOT, spec_drafts=())}),
    Row("0.5.13", "0.5.13", ("0.5.13",), {"graphs_off": GRAPHS_OFF_OLD, "metrics": _NO_TPOT}),
    Row("0.5.14", "0.5.21", tuple(f"0.5.{i}" for i in range(14, 22)), {"graphs_off": GRAPHS_OFF, "metrics": _NO_TPOT}),
    Row("0.5.22", "0.5.23", ("0.5.22", "0.5.23"), {"graphs_off": GRAPHS_OFF, "metrics": SGLANG}),
))
DTYPE_SOURCE = AS_REQUESTED + " (/server_info `dtype` is the argument SGLang was given, not the dtype it loaded)"


def reported_dtype(info: dict[str, Any], asked: str | None) -> str | None:
    """The dtype argument in SGLang's server info, else the one asked (what a server that was
    started with another dtype says it was given; SGLang reports no loaded dtype)."""
    d = info.get("dtype")
    return str(d) if d not in (None, "", "auto") else asked


def cuda_graphs(si: dict[str, Any]) -> tuple[bool | None, str]:
    """Whether decode CUDA graphs run, from the *resolved* config (hooks can switch them off
    whatever was asked): `cuda_graph_config.decode.backend` (0.5.14+), else the pre-refactor
    `disable_cuda_graph`. The user-input `cuda_graph_backend_decode` is never read."""
    cfg = si.get("cuda_graph_config")
    if isinstance(cfg, dict) and isinstance(cfg.get("decode"), dict) and cfg["decode"].get("backend"):
        return cfg["decode"]["backend"] != "disabled", "/server_info cuda_graph_config.decode.backend"
    if "disable_cuda_graph" in si and "cuda_graph_backend_decode" not in si:  # before the refactor
        return not as_bool(si["disable_cuda_graph"]), "/server_info disable_cuda_graph"
    return None, ""



KV_HOW = "--max-total-tokens (an upper bound: SGLang takes the minimum with what fits in memory)"
NGRAM_WINDOW = ("SGLang's NGRAM drafts from a trie of every request's recent tokens (depth "
                "--speculative-ngram-max-trie-depth, default 18), not from the request's own last "
                "prompt_lookup_min..prompt_lookup_max tokens; those two settings have no SGLang flag")


def feature_args(options: dict[str, Any]) -> dict[str, Any]:
    """SGLang server arguments (ServerArgs field -> value) for the uniform features
    (adapters.common.features); ValueError when they contradict option disable_radix_cache."""
    out: dict[str, Any] = {}
    prefix = features.prefix_caching("sglang", options)
    if prefix is not None:
        if options.get("disable_radix_cache") is not None and options["disable_radix_cache"] == prefix:
            raise ValueError("engine 'sglang': enable_prefix_caching and disable_radix_cache contradict each other")
        out["disable_radix_cache"] = not prefix
    spec = features.speculative("sglang", options.get("speculative_config"))
    if spec is not None:
        k = spec["num_speculative_tokens"]
        if spec["method"] == "ngram":
            out.update(speculative_algorithm="NGRAM", speculative_num_draft_tokens=k + 1,
                       speculative_ngram_max_bfs_breadth=1)
        else:
            out.update(speculative_algorithm="STANDALONE", speculative_draft_model_path=spec["model"],
                       speculative_num_steps=k, speculative_eagle_topk=1, speculative_num_draft_tokens=k + 1)
    return out


def feature_flags(options: dict[str, Any]) -> list[str]:
    """`feature_args` as launch flags (a true boolean is a bare flag, a false one is left out)."""
    out: list[str] = []
    for k, v in feature_args(options).items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v is not False:
            out += [flag, str(v)]
    return out


def sglang_speculative(si: dict[str, Any]) -> dict[str, Any] | bool | None:
    """The speculation a server reports, in the uniform keys (False: off; None: not reported)."""
    if "speculative_algorithm" not in si:
        return None
    algo = si.get("speculative_algorithm")
    if algo in (None, "", "NONE"):
        return False
    steps, drafts = si.get("speculative_num_steps"), si.get("speculative_num_draft_tokens")
    native = {k: si.get(k) for k in ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                                     "speculative_num_draft_tokens", "speculative_draft_model_path") if k in si}
    if algo == "NGRAM":
        return {"method": "ngram", "num_speculative_tokens": drafts - 1 if drafts else None, "sglang": native}
    if algo == "STANDALONE":
        return {"method": "draft_model", "num_speculative_tokens": steps,
                "model": si.get("speculative_draft_model_path"), "sglang": native}
    return {"method": str(algo).lower(), "num_speculative_tokens": steps, "sglang": native}


# the ServerArgs fields read_back takes from /server_info (checked against SGLang's own list by
# tests/adapters/test_sglang_contract.py); max_total_num_tokens, max_req_input_len and
# internal_states come from the scheduler
SERVER_INFO_KEYS = ("dtype", "page_size", "max_running_requests", "chunked_prefill_size", "max_prefill_tokens",
                    "context_length", "disable_radix_cache", "cuda_graph_config", "disable_cuda_graph",
                    "enable_torch_compile", "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                    "speculative_num_draft_tokens", "speculative_draft_model_path", "tp_size",
                    "enable_deterministic_inference")
# sampling_seed is read only in deterministic mode: SamplingBatchInfo.from_schedule_batch builds the
# seed tensor only when exec.deterministic.enable_deterministic_inference is on, else sampling draws
# from the global generator (srt/sampling/sampling_batch_info.py, SGLang 0.5.23); the flag is
# declared in every release of VERSIONS (0.5.9's parser: fixtures/sglang/parser_0.5.9.json)
SEEDED = ("/server_info enable_deterministic_inference (SGLang uses a request's sampling_seed only with "
          "--enable-deterministic-inference: srt/sampling/sampling_batch_info.py)")


def read_back(si: dict[str, Any], argv: list[str] | None = None,
              asked_dtype: str | None = None) -> tuple[dict[str, Any], dict[str, int]]:
    """EngineInfo.effective and .memory from a /server_info answer (see the module docstring)."""
    rb, src = ReadBack(), "/server_info"
    state = (si.get("internal_states") or [{}])[0] or {}
    rb.put("dtype", reported_dtype(si, asked_dtype), DTYPE_SOURCE)
    rb.put("kv_capacity_tokens", si.get("max_total_num_tokens"), src + " max_total_num_tokens")
    rb.put("block_size", si.get("page_size"), src + " page_size")
    rb.put("max_num_seqs", state.get("effective_max_running_requests_per_dp"),
           src + " internal_states[0].effective_max_running_requests_per_dp")
    rb.put("max_num_seqs", si.get("max_running_requests"), src + " max_running_requests")
    chunk = si.get("chunked_prefill_size")
    if "chunked_prefill_size" in si:
        rb.put("chunked_prefill", chunk not in (None, -1, 0), src + " chunked_prefill_size (-1: off)")
        rb.put("max_num_batched_tokens", chunk if chunk not in (None, -1, 0) else si.get("max_prefill_tokens"),
               src + (" chunked_prefill_size" if chunk not in (None, -1, 0) else " max_prefill_tokens"))
    rb.put("max_model_len", si.get("context_length"), src + " context_length")  # not max_req_input_len (inputs only)
    if "disable_radix_cache" in si:
        rb.put("prefix_caching", not as_bool(si["disable_radix_cache"]), src + " disable_radix_cache")
    graphs, where = cuda_graphs(si)
    rb.put("cuda_graphs", graphs, where)
    rb.put("compile", as_bool(si.get("enable_torch_compile")), src + " enable_torch_compile")
    rb.put("speculative", sglang_speculative(si), src + " speculative_*")
    rb.put("tensor_parallel_size", si.get("tp_size"), src + " tp_size")
    rb.put("pipeline_parallel_size", si.get("pp_size"), src + " pp_size")
    rb.put("data_parallel_size", si.get("dp_size"), src + " dp_size")
    if "enable_deterministic_inference" in si:
        rb.put("seeded_sampling", bool(as_bool(si["enable_deterministic_inference"])), SEEDED)
    rb.put("launch_command", launch_command(argv), "the argv this adapter launched")
    mem = state.get("memory_usage") or {}
    where = src + " internal_states[0].memory_usage.{} (GiB, 0.001 resolution)"
    for key, field in (("weights", "weight"), ("kv_allocated", "kvcache")):
        if isinstance(mem.get(field), (int, float)):
            rb.mem(key, round(mem[field] * GIB), where.format(field))
    if isinstance(mem.get("graph"), dict) and mem["graph"]:
        rb.mem("graph_pool", round(sum(mem["graph"].values()) * GIB), where.format("graph"))
    return rb.result()
