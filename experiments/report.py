"""report.md: the side-by-side comparison of every engine in one or more run folders.

Invariant: the report states the config, the fairness rules and the metric definitions it
was computed under, and flags every row an engine could not make fair (KV not pinned,
engine inside the harness's interpreter, requests that stopped before max_tokens,
token-count mismatches).
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from experiments import bandwidth, plots
from experiments.summary import Runs, agreement, load_runs, same_prompts, summarize

FAIRNESS = """Same model directory, same dtype, same token-exact prompts, same sampling (greedy + `ignore_eos`
+ fixed output length by default), same arrival schedule (seeded), same KV budget *in tokens* where
the engine allows pinning it, warm-up excluded, one engine on the device at a time, and the harness
outside the engine's process for latency comparisons, with its own CPU share recorded. Rows an engine
could not make fair are flagged below."""

DEFINITIONS = """- **TTFT**: send -> first event carrying >= 1 token. **E2EL**: send -> last token event.
- **ITL**: gap between consecutive token-bearing events, split evenly over the later event's tokens; pooled.
- **TPOT**: (E2EL - TTFT) / (output tokens - 1), per request.
- **Throughput**: tokens / wall time (first send -> last finish). **Goodput**: requests/s meeting every SLO.
- Token counts come from the returned token ids; the engine-reported and re-tokenized counts are cross-checks."""


def _f(v: Any, digits: int = 2) -> str:
    if v is None or v != v:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _mib(v: Any) -> str:
    return "–" if v is None or v != v else f"{v / 2**20:,.1f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _group(runs: Runs, rows: list[tuple[str, Callable[[dict], Any]]]) -> list[str]:
    """One table: a row per (level, metric), a column per engine that finished requests."""
    multi = len(runs.levels) > 1
    engines = [e for e in runs.engines if e.summary]
    if not engines:
        return ["No engine finished any request."]
    header = (["level"] if multi else []) + ["metric"] + [e.label for e in engines]
    body = []
    for level in runs.levels:
        for name, get in rows:
            cells = []
            for e in engines:
                s = e.summary.get(level)
                cells.append(get(s) if s else "–")
            body.append(([level] if multi else []) + [name] + cells)
    return _table(header, body)


def _latency_rows() -> list[tuple[str, Callable[[dict], Any]]]:
    rows = []
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2EL")):
        for st in ("mean", "median", "p90", "p99"):
            rows.append((f"{label} {st} (ms)", lambda s, k=key, t=st: _f(s[k][t])))
    return rows


THROUGHPUT = [
    ("requests", lambda s: _f(s["num_requests"])),
    ("wall time (s)", lambda s: _f(s["duration_s"])),
    ("output tokens/s", lambda s: _f(s["output_throughput"])),
    ("total tokens/s", lambda s: _f(s["total_throughput"])),
    ("requests/s", lambda s: _f(s["request_throughput"], 3)),
    ("goodput (req/s)", lambda s: _f(s["goodput"], 3)),
    ("requests meeting SLOs", lambda s: _f(s["slo_met"])),
]
MEMORY = [
    ("peak RSS, engine process tree (MiB)", lambda s: _mib(s["memory"].get("peak_rss_bytes"))),
    ("RSS after warm-up (MiB)", lambda s: _mib(s["memory"].get("after_warmup_rss_bytes"))),
    ("peak GPU memory (MiB)", lambda s: _mib(s["memory"].get("peak_gpu_bytes"))),
    ("KV capacity (tokens)", lambda s: _f(s["memory"].get("kv_capacity_tokens"))),
    ("peak KV usage", lambda s: _f(s["memory"].get("peak_kv_usage"), 3)),
    ("mean running seqs", lambda s: _f(s["memory"].get("mean_num_running"))),
]
CHECKS = [
    ("stopped before max_tokens", lambda s: _f(s["token_checks"]["stopped_early"])),
    ("engine-reported count != ids", lambda s: _f(s["token_checks"]["reported_count_mismatch"])),
    ("engine prompt count != sent ids", lambda s: _f(s["token_checks"]["prompt_count_mismatch"])),
    ("re-tokenized text count != ids", lambda s: _f(s["token_checks"]["retokenized_mismatch"])),
]
BANDWIDTH = [
    ("running seqs (mean)", lambda s: _f(s["bandwidth"].get("running_seqs"))),
    ("mean context (tokens)", lambda s: _f(s["bandwidth"].get("mean_context"), 1)),
    ("bytes per decode step (MiB)", lambda s: _mib(s["bandwidth"].get("step_bytes"))),
    ("median TPOT (ms)", lambda s: _f(s["bandwidth"].get("tpot_ms"))),
    ("achieved GB/s (estimate)", lambda s: _f(s["bandwidth"].get("achieved_gbps"))),
]
HARNESS = [
    ("harness CPU (s)", lambda s: _f(s["harness"]["cpu_s"])),
    ("share of one core", lambda s: _f(s["harness"]["core_share"], 3)),
    ("CPU per request (ms)", lambda s: _f(s["harness"]["cpu_ms_per_request"])),
]


def _provenance(runs: Runs) -> list[str]:
    """The commands that produced the runs, and the machine they ran on (from the manifests)."""
    lines, seen = [], set()
    for e in runs.engines:
        m = e.manifest
        cmd, hw = m.get("command"), m.get("hardware") or {}
        if cmd and cmd not in seen:
            seen.add(cmd)
            lines.append(f"- command: `{cmd}` (started {m.get('started_at', '?')}, git {str(m.get('git_commit'))[:10]})")
        machine = f"{hw.get('cpu', '?')}, {hw.get('cores_logical', '?')} logical cores, " \
                  f"{(hw.get('ram_bytes') or 0) / 2**30:.0f} GiB RAM, GPUs: {', '.join(hw.get('gpus') or []) or 'none'}"
        if machine not in seen:
            seen.add(machine)
            lines.append(f"- machine: {machine}")
    return lines


def _engines(runs: Runs) -> list[str]:
    rows = []
    for e in runs.engines:
        m, info = e.manifest, e.manifest.get("info") or {}
        mode = info.get("mode", "–") + (" (same interpreter)" if m.get("same_process") else "")
        label = e.label + (" (naive baseline)" if e.name == "hf" else "")
        rows.append([label, m.get("status", "–"), mode, info.get("version", "–"), info.get("dtype", "–"),
                     _f(info.get("kv_capacity_tokens")), _f(m.get("kv_pinned")), _f(m.get("sessions")),
                     (m.get("reason") or "").replace("|", "/").replace("\n", " ")[:300]])
    return _table(["engine", "status", "mode", "version", "dtype", "KV capacity (tokens)", "KV pinned",
                   "sessions", "reason"], rows)


def _flags(runs: Runs) -> list[str]:
    out = []
    for e in runs.engines:
        if e.manifest.get("same_process"):
            out.append(f"- **{e.label}** ran inside the harness's interpreter: its latency numbers are perturbed "
                       "by the client (in-process mode is for offline throughput only).")
        if (e.manifest.get("info") or {}).get("mode") == "attach":
            out.append(f"- **{e.label}** was attached to a server started elsewhere: its process memory is not "
                       "measured here and its KV budget was set by whoever started it.")
        elif e.manifest.get("kv_pinned") is False and any(c[1].get("kv", {}).get("tokens") for c in runs.configs):
            out.append(f"- **{e.label}** does not take a pinned KV budget in tokens; see its KV capacity above.")
        for level, s in e.summary.items():
            c = s["token_checks"]
            if c["stopped_early"]:
                why = ("TGI has no `ignore_eos`" if (e.manifest.get("info") or {}).get("knobs", {}).get("ignore_eos")
                       == "unsupported" else "the engine did not honour `ignore_eos`")
                out.append(f"- **{e.label}** {level}: {c['stopped_early']} request(s) stopped before max_tokens "
                           f"({why}); its throughput counts fewer tokens.")
            if c["reported_count_mismatch"] or c["prompt_count_mismatch"]:
                out.append(f"- **{e.label}** {level}: token counts reported by the engine differ from the ids "
                           f"({c['reported_count_mismatch']} output, {c['prompt_count_mismatch']} prompt).")
            if s["harness"].get("warning") and not e.manifest.get("same_process"):
                out.append(f"- **{e.label}** {level}: {s['harness']['warning']}.")
    return out or ["- none"]


def _agreement(runs: Runs) -> list[str]:
    base = runs.baseline
    agr = agreement(runs)
    if base is None or not agr:
        return ["Only one engine finished requests; nothing to compare."]
    rows = [[label, lv, _f(a["requests"]), _f(a["exact"], 3), _f(a["prefix"], 3)]
            for label, levels in agr.items() for lv, a in levels.items()]
    return [f"Against **{base.label}**, over the requests both finished (greedy sampling should agree; "
            "small numeric differences can flip a near-tie and everything after it):", ""] + \
        _table(["engine", "level", "requests", "identical outputs", "mean matching prefix"], rows)


def build(dirs: list[Path], out: Path) -> Path:
    """Summarize `dirs`, draw the plots and write `out/report.md`; returns its path."""
    runs = load_runs([Path(d) for d in dirs])
    summarize(runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(exist_ok=True)
    pngs = plots.latency_cdfs(runs, out / "plots") + plots.sweep(runs, out / "plots")
    names = ", ".join(c[1]["name"] for c in runs.configs)
    md = [f"# inferlab report: {names}", "",
          f"Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} from "
          + ", ".join(f"`{d}`" for d, _, _ in runs.configs) + ".", ""] + _provenance(runs) + [
          "", "## Engines", ""] + _engines(runs)
    sp = same_prompts(runs)
    md += ["", "Prompt token ids identical across engines (from requests.jsonl): " + _f(sp), "",
           "## Fairness rules", "", FAIRNESS, "", "Flags:", ""] + _flags(runs)
    md += ["", "## Metric definitions", "", DEFINITIONS, ""]
    for title, rows in (("Latency", _latency_rows()), ("Throughput", THROUGHPUT), ("Memory", MEMORY),
                        ("Token-count checks", CHECKS), ("Harness CPU (the observer's cost)", HARNESS)):
        md += [f"## {title}", ""] + _group(runs, rows) + [""]
    md.insert(md.index("## Harness CPU (the observer's cost)") - 1,
              "Re-tokenizing streamed text is a cross-check only: random-token outputs of a random-weight model "
              "often re-tokenize to a different count (BPE merges across token boundaries).\n")
    md += ["## Greedy-token agreement", ""] + _agreement(runs) + [""]
    peak = next((e.manifest.get("peak_bandwidth") for e in runs.engines if e.manifest.get("peak_bandwidth")), {})
    md += ["## How far from the hardware (estimate)", "",
           f"Formula: {bandwidth.FORMULA}. Weights and KV bytes come from the model's safetensors headers and "
           "config.json; activations and overheads are ignored, so this is an estimate.", "",
           f"Measured peak in this run (copy of {peak.get('size_mb', '?')} MB, read + write): "
           f"CPU {_f(peak.get('cpu_gbps'))} GB/s, GPU {_f(peak.get('gpu_gbps'))} GB/s.", ""]
    md += _group(runs, BANDWIDTH) + [""]
    md += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in pngs] + [""]
    md += ["## Config", ""]
    for d, cfg, toml in runs.configs:
        md += [f"`{d}/config.toml`:", "", "```toml", toml.strip() or "(missing)", "```", ""]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path
