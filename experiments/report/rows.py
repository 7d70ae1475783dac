"""The metric rows of the report's side-by-side tables: (label, summary -> cell)."""
from __future__ import annotations

from typing import Any, Callable

from experiments.report.md import fmt, mib

Rows = list[tuple[str, Callable[[dict], Any]]]


def latency_rows() -> list[tuple[str, Callable[[dict], Any]]]:
    rows = []
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2EL")):
        for st in ("mean", "median", "p90", "p99"):
            rows.append((f"{label} {st} (ms)", lambda s, k=key, t=st: fmt(s[k][t])))
    return rows


THROUGHPUT = [
    ("requests", lambda s: fmt(s["num_requests"])),
    ("wall time (s)", lambda s: fmt(s["duration_s"])),
    ("output tokens/s", lambda s: fmt(s["output_throughput"])),
    ("total tokens/s", lambda s: fmt(s["total_throughput"])),
    ("requests/s", lambda s: fmt(s["request_throughput"], 3)),
    ("goodput (req/s)", lambda s: fmt(s["goodput"], 3)),
    ("requests meeting SLOs", lambda s: fmt(s["slo_met"])),
]
MEMORY = [
    ("peak RSS, engine process tree (MiB)", lambda s: mib(s["memory"].get("peak_rss_bytes"))),
    ("RSS after warm-up (MiB)", lambda s: mib(s["memory"].get("after_warmup_rss_bytes"))),
    ("peak GPU memory (MiB)", lambda s: mib(s["memory"].get("peak_gpu_bytes"))),
    ("KV capacity (tokens)", lambda s: fmt(s["memory"].get("kv_capacity_tokens"))),
    ("peak KV usage", lambda s: fmt(s["memory"].get("peak_kv_usage"), 3)),
    ("mean running seqs", lambda s: fmt(s["memory"].get("mean_num_running"))),
]
CHECKS = [
    ("stopped before max_tokens", lambda s: fmt(s["token_checks"]["stopped_early"])),
    ("engine-reported count != ids", lambda s: fmt(s["token_checks"]["reported_count_mismatch"])),
    ("engine prompt count != sent ids", lambda s: fmt(s["token_checks"]["prompt_count_mismatch"])),
    ("re-tokenized text count != ids", lambda s: fmt(s["token_checks"]["retokenized_mismatch"])),
]
BANDWIDTH = [
    ("running seqs (mean)", lambda s: fmt(s["bandwidth"].get("running_seqs"))),
    ("mean context (tokens)", lambda s: fmt(s["bandwidth"].get("mean_context"), 1)),
    ("bytes per decode step (MiB)", lambda s: mib(s["bandwidth"].get("step_bytes"))),
    ("median TPOT (ms)", lambda s: fmt(s["bandwidth"].get("tpot_ms"))),
    ("achieved GB/s (estimate)", lambda s: fmt(s["bandwidth"].get("achieved_gbps"))),
]
HARNESS = [
    ("harness CPU (s)", lambda s: fmt(s["harness"]["cpu_s"])),
    ("share of one core", lambda s: fmt(s["harness"]["core_share"], 3)),
    ("CPU per request (ms)", lambda s: fmt(s["harness"]["cpu_ms_per_request"])),
]
