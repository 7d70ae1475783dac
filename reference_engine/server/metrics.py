"""Prometheus metrics with vLLM's names and meanings, so one scraper reads us and vLLM.

Gauges and engine counters are read from `engine.stats()` at scrape time (a custom
collector); latency histograms are observed by the server as tokens reach it. Everything
lives in a per-app `CollectorRegistry`, never the process-global one, so two apps in one
process (tests) do not share counts.

| metric | meaning |
|---|---|
| vllm:num_requests_running / _waiting | requests scheduled / queued in the engine now |
| vllm:kv_cache_usage_perc | fraction (0..1) of KV blocks in use (vLLM's name, vLLM's 0..1 value) |
| vllm:prompt_tokens_total / generation_tokens_total | tokens prefilled / generated, as the engine counts them |
| vllm:num_preemptions_total | preemptions |
| vllm:request_queue_time_seconds | arrival -> first scheduled, per request (its sum and count; one +Inf bucket) |
| vllm:prefix_cache_queries_total / _hits_total | prompt tokens looked up in / found in the prefix cache |
| vllm:spec_decode_num_drafts_total | requests x steps that had draft tokens verified (only with speculation) |
| vllm:spec_decode_num_draft_tokens_total / _num_accepted_tokens_total | draft tokens verified / accepted |
| vllm:spec_decode_num_accepted_tokens_per_pos_total{position} | accepted drafts at each draft position |
| vllm:time_to_first_token_seconds | request accepted by the server -> first token |
| vllm:inter_token_latency_seconds | gap between token-bearing outputs, split evenly over their tokens |
| vllm:e2e_request_latency_seconds | request accepted -> finished |
| vllm:request_success_total{finished_reason} | requests finished with "stop" or "length" |
| vllm:cache_config_info{block_size,num_gpu_blocks,enable_prefix_caching} | constant 1; the labels carry the KV geometry |
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's bucket edges, so histograms from both engines line up bucket for bucket.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)


class _EngineCollector:
    """Reads the engine's own counters and gauges each scrape (no double bookkeeping)."""

    def __init__(self, engine, model_name: str):
        self.engine, self.model = engine, model_name

    def collect(self):
        s = self.engine.stats()
        m = [self.model]

        def gauge(name, doc, value):
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(m, value)
            return g

        def counter(name, doc, value):
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(m, value)
            return c

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", s.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens_total)
        yield counter("vllm:num_preemptions", "Cumulative number of preemptions.", s.num_preemptions_total)
        # vLLM's queue-time histogram, as a sum and a count (one +Inf bucket): the engine sums each request's wait
        queue = HistogramMetricFamily("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase "
                                      "for request.", labels=["model_name"])
        queue.add_metric(m, [("+Inf", s.request_queue_count)], s.request_queue_time_s)
        yield queue
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", s.prefix_cache_queries)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", s.prefix_cache_hits)
        if s.spec_decode_num_accepted_tokens_per_pos:  # exported only with speculation on, as in vLLM
            yield counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", s.spec_decode_num_drafts)
            yield counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
                          s.spec_decode_num_draft_tokens)
            yield counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                          s.spec_decode_num_accepted_tokens)
            per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                          "Accepted tokens per draft position.", labels=["model_name", "position"])
            for pos, n in enumerate(s.spec_decode_num_accepted_tokens_per_pos):
                per_pos.add_metric([self.model, str(pos)], n)
            yield per_pos
        if s.tp_decode_steps:  # tensor parallelism: rank 0's plain decode steps and their all-reduces
            yield counter("inferlab:tp_decode_steps", "Plain decode steps (tensor parallel).", s.tp_decode_steps)
            yield counter("inferlab:tp_decode_seconds", "Wall time of those steps, seconds.", s.tp_decode_seconds)
            yield counter("inferlab:tp_decode_allreduce_seconds", "All-reduce time inside them, seconds.",
                          s.tp_decode_allreduce_seconds)
            yield counter("inferlab:tp_decode_allreduce_bytes", "All-reduce message bytes inside them.",
                          s.tp_decode_allreduce_bytes)
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the KV cache configuration.",
                                 labels=["block_size", "num_gpu_blocks", "enable_prefix_caching"])
        info.add_metric([str(s.block_size), str(s.kv_total_blocks), str(self.engine.config.enable_prefix_caching)],
                        1.0)
        yield info


class ServerMetrics:
    """One app's registry. `observe_*` are called by the request code; `render()` serves /metrics."""

    def __init__(self, engine, model_name: str):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, buckets=TTFT_BUCKETS, registry=self.registry).labels(model_name)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             labels, buckets=ITL_BUCKETS, registry=self.registry).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                             labels, buckets=E2E_BUCKETS, registry=self.registry).labels(model_name)
        self._success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                ["model_name", "finished_reason"], registry=self.registry)
        self._model = model_name
        for reason in ("stop", "length"):  # exported from the start, at 0, like vLLM
            self._success.labels(model_name, reason)
        self.registry.register(_EngineCollector(engine, model_name))

    def finished(self, reason: str | None) -> None:
        if reason in ("stop", "length"):
            self._success.labels(self._model, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
