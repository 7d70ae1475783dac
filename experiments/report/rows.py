"""The metric rows of the report's side-by-side tables: (label, path into the summary, unit).

A cell is the summary's value at that path (the median over repeats when there are
several) followed by its 95 % interval `[lo–hi]` where the summary has one (see
experiments/measuring/intervals.py). Units: "f2"/"f3"/"f1" decimals, "int", "mib" (bytes shown in MiB),
"pct" (a fraction shown in percent).
"""
from __future__ import annotations

from typing import Any

from experiments.measuring.intervals import get
from experiments.report.md import fmt, mib, table
from experiments.report.summary import Runs

Row = tuple[str, str, str]


def show(v: Any, unit: str) -> str:
    if unit == "mib":
        return mib(v)
    if unit == "pct":
        return "–" if v is None else f"{100 * v:.1f} %"
    if unit == "int":
        return fmt(int(round(v)) if isinstance(v, float) and v == v else v)
    return fmt(v, int(unit[1]) if unit.startswith("f") else 2)


def cell(s: dict[str, Any], path: str, unit: str) -> str:
    v = get(s, path)
    ci = (s.get("ci") or {}).get(path)
    if ci is None or v is None:
        return show(v, unit)
    return f"{show(v, unit)} [{show(ci[0], unit)}–{show(ci[1], unit)}]"


def latency_rows() -> list[Row]:
    return [(f"{label} {st} (ms)", f"{key}.{st}", "f2")
            for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2EL"))
            for st in ("mean", "median", "p90", "p99")]


THROUGHPUT: list[Row] = [
    ("requests", "num_requests", "int"),
    ("wall time (s)", "duration_s", "f2"),
    ("output tokens/s", "output_throughput", "f2"),
    ("output tokens/s per device (GPU, or TP rank on CPU)", "parallel.output_throughput_per_device", "f2"),
    ("total tokens/s", "total_throughput", "f2"),
    ("requests/s", "request_throughput", "f3"),
    ("goodput (req/s)", "goodput", "f3"),
    ("requests meeting SLOs", "slo_met", "int"),
    ("cost per million output tokens", "cost_per_m_output", "f3"),
]
MEMORY: list[Row] = [
    ("peak RSS, engine process tree (MiB)", "memory.peak_rss_bytes", "mib"),
    ("RSS after warm-up (MiB)", "memory.after_warmup_rss_bytes", "mib"),
    ("peak GPU memory (MiB)", "memory.peak_gpu_bytes", "mib"),
    ("KV capacity (tokens)", "memory.kv_capacity_tokens", "int"),
    ("peak KV usage (timeline only)", "memory.peak_kv_usage", "f3"),
    ("mean running seqs (timeline only)", "memory.mean_num_running", "f2"),
    ("mean requests decoding (client)", "mean_in_flight", "f2"),
]
CHECKS: list[Row] = [
    ("stopped before max_tokens", "token_checks.stopped_early", "int"),
    ("engine-reported count != ids", "token_checks.reported_count_mismatch", "int"),
    ("engine prompt count != sent ids", "token_checks.prompt_count_mismatch", "int"),
    ("re-tokenized text count != ids", "token_checks.retokenized_mismatch", "int"),
]
BANDWIDTH: list[Row] = [
    ("running seqs (mean)", "bandwidth.running_seqs", "f2"),
    ("mean context (tokens)", "bandwidth.mean_context", "f1"),
    ("bytes per decode step (MiB)", "bandwidth.step_bytes", "mib"),
    ("median TPOT (ms)", "bandwidth.tpot_ms", "f2"),
    ("achieved GB/s (estimate)", "bandwidth.achieved_gbps", "f2"),
    ("decode: share of the copy bandwidth", "ceilings.decode_of_ceiling", "pct"),
    ("bandwidth floor per step (ms): bytes ÷ copy GB/s", "ceilings.floor_ms", "f2"),
    ("median TPOT ÷ bandwidth floor", "ceilings.tpot_over_floor", "f2"),
    ("prefill GFLOP/s (estimate)", "ceilings.prefill_gflops", "f2"),
    ("prefill: share of the matmul ceiling", "ceilings.prefill_of_ceiling", "pct"),
    ("tensor parallel: decode steps timed (engine's own)", "parallel.decode_steps", "int"),
    ("tensor parallel: all-reduce share of a decode step (measured)", "parallel.allreduce_share", "pct"),
    ("tensor parallel: all-reduce per decode step (ms, measured)", "parallel.allreduce_ms", "f2"),
    ("tensor parallel: all-reduce bytes per decode step", "parallel.allreduce_bytes", "int"),
    ("tensor parallel: estimate (ms): 2(N-1)/N x bytes ÷ link (copy) GB/s", "parallel.estimate_ms", "f3"),
    ("tensor parallel: estimated share of a decode step", "parallel.estimate_share", "pct"),
]
HARNESS: list[Row] = [
    ("harness CPU (s)", "harness.cpu_s", "f2"),
    ("share of one core", "harness.core_share", "f3"),
    ("CPU per request (ms)", "harness.cpu_ms_per_request", "f2"),
    ("engine process tree: cores busy (CPU s / wall s)", "harness.engine_cores", "f2"),
    ("  of which its root process (a server: the front end)", "harness.front_end_cores", "f2"),
    ("engine processes", "harness.engine_processes", "int"),
]
CACHE: list[Row] = [
    ("prefix cache hit rate (engine's own)", "engine_counters.prefix_hit_rate", "pct"),
    ("prefix cache lookups (tokens)", "engine_counters.prefix_queries", "int"),
    ("speculative acceptance rate (engine's own)", "engine_counters.spec_acceptance_rate", "pct"),
    ("mean accepted tokens per draft", "engine_counters.spec_mean_accepted", "f2"),
    ("draft tokens proposed", "engine_counters.spec_draft_tokens", "int"),
]


def group(runs: Runs, rows: list[tuple[str, str, str]], empty: str | None = None) -> list[str]:
    """One table: a row per (level, metric), a column per engine that finished requests."""
    multi = len(runs.levels) > 1
    engines = [e for e in runs.engines if e.summary]
    if not engines:
        return ["No engine finished any request."]
    header = (["level"] if multi else []) + ["metric"] + [e.label for e in engines]
    body = []
    for level in runs.levels:
        for name, path, unit in rows:
            cells = [cell(e.summary[level], path, unit) if level in e.summary else "–" for e in engines]
            if all(c == "–" for c in cells):
                continue  # a metric no engine has at this level (e.g. cost without cost_per_hour)
            body.append(([level] if multi else []) + [name] + cells)
    if not body and empty:
        return [empty]
    return table(header, body)
