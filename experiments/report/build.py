"""`build`: summarize run folders, draw the plots and write report.md (sections in their own modules)."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from experiments.measuring import bandwidth
from experiments.report import answers, frontier, observer, plots, predicted, sections, settings, verdict, where, workload
from experiments.report.md import fmt
from experiments.report.rows import BANDWIDTH, CACHE, CHECKS, HARNESS, MEMORY, THROUGHPUT, group, latency_rows
from experiments.report.summary import load_runs, same_prompts, summarize

FAIRNESS = """Same model directory, same dtype, same token-exact prompts, same sampling (greedy + `ignore_eos`
+ fixed output length by default), same arrival schedule (seeded), same KV budget *in tokens* where
the engine allows pinning it, warm-up excluded, one engine on the device at a time, nothing sent to the
engine during a measured level but the workload (its metrics are read just before and just after; a
timeline during the level is opt-in and flagged), and the harness outside the engine's process for
latency comparisons, with its own CPU share recorded. Rows an engine could not make fair are flagged below."""

DEFINITIONS = """- **TTFT**: send -> first event carrying >= 1 token. **E2EL**: send -> last token event.
- **ITL**: gap between consecutive token-bearing events, split evenly over the later event's tokens; pooled.
- **TPOT**: (E2EL - TTFT) / (output tokens - 1), per request.
- **Throughput**: tokens / wall time (first send -> last finish). **Goodput**: requests/s meeting every SLO.
- Token counts come from the returned token ids; the engine-reported and re-tokenized counts are cross-checks."""


def ceiling_line(runs) -> str:
    c = next((e.manifest.get("compute_peak") for e in runs.engines if e.manifest.get("compute_peak")), {})
    if not c.get("gflops"):
        return f"Compute ceiling: not measured ({c.get('error', 'no measurement in these runs')})."
    libs = ", ".join(f"{k} {fmt(v)}" for k, v in (c.get("by_library") or {}).items())
    return (f"Compute ceiling measured in this run: {fmt(c['gflops'])} GFLOP/s ({c['dtype']} matmuls of the model's "
            f"projection shapes, {c['shapes'][0][0]} tokens, on {c['device']} with {c['threads']} threads"
            + (f"; the best of {libs}" if libs else "") + "; "
            "experiments/measuring/ceilings.py). Prefill GFLOP/s = 2 x non-embedding params x mean prompt tokens / median TTFT "
            "(a lower bound under concurrency: TTFT includes queueing).")


def wants_frontier(cfg: dict) -> bool:
    """A sweep, or a config that names interactivity targets, gets the frontier section."""
    return (cfg.get("load") or {}).get("mode") == "sweep" or bool((cfg.get("frontier") or {}).get("interactivity"))


CPU = "CPU: the harness (the observer's cost) and the engine's processes"


def build(dirs: list[Path], out: Path) -> Path:
    """Summarize `dirs`, draw the plots and write `out/report.md`; returns its path."""
    runs = load_runs([Path(d) for d in dirs])
    summarize(runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(exist_ok=True)
    pngs = plots.latency_cdfs(runs, out / "plots") + plots.sweep(runs, out / "plots") + plots.search(runs, out / "plots")
    names = ", ".join(c[1]["name"] for c in runs.configs)
    md = [f"# inferlab report: {names}", "",
          f"Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} from "
          + ", ".join(f"`{d}`" for d, _, _ in runs.configs) + ".", ""] + sections.provenance(runs) + [
          "", "## Engines", ""] + sections.engines(runs)
    sim = [e.label for e in runs.engines if e.manifest.get("simulated")]
    if sim:  # inferlab simulate: say it before any number
        md[4:4] = [f"**Simulated, not measured: {', '.join(sim)}** (inferlab simulate: the reference engine's "
                   "scheduler in simulated time, step times from a device profile; see each engine's profile "
                   "below).", ""]
    sp = same_prompts(runs)
    md += ["", *placed] if (placed := where.section(runs)) else []
    md += ["", "Prompt token ids identical across engines (from requests.jsonl): " + fmt(sp), "",
           "## Workload", ""] + workload.section(runs) + ["",
           "## Fairness rules", "", FAIRNESS, "", "Flags:", ""] + (settings.fairness_flags(runs) + sections.flags(runs) or ["- none"])
    shown = answers.section(runs)
    md += ["", "## Answers, side by side", ""] + shown if shown else []
    md += ["", "## Effective settings, read back", ""] + settings.settings_section(runs)
    md += ["", "## Metric definitions", "", DEFINITIONS, ""]
    md += ["## Who is faster", "", verdict.basis(runs), ""] + verdict.lines(runs) + [""]
    md += verdict.search_section(runs)
    if any(wants_frontier(cfg) for _, cfg, _ in runs.configs):
        md += frontier.section([(None, runs)], runs.configs[0][1], out)
    md += predicted.section(runs, out / "plots")
    md += ["## Latency", ""] + group(runs, latency_rows()) + [""]
    md += ["## The server's own view", ""] + observer.section(runs) + [""]
    md += ["## Memory split", ""] + settings.memory_section(runs) + [""]
    md += ["## Prefix cache and speculation (each engine's own counters)", "",
           "Read from each engine's metrics (or, for an engine without them, its adapter's snapshots) just before "
           "and just after each level; a dash where an engine does not expose the counter or the feature was off.",
           ""] + group(runs, CACHE, empty="No engine reported prefix-cache or speculation counters.") + [""]
    for title, rows in (("Throughput", THROUGHPUT), ("Memory", MEMORY),
                        ("Token-count checks", CHECKS), (CPU, HARNESS)):
        md += [f"## {title}", ""] + group(runs, rows) + [""]
    md.insert(md.index(f"## {CPU}") - 1,
              "Re-tokenizing streamed text is a cross-check only: random-token outputs of a random-weight model "
              "often re-tokenize to a different count (BPE merges across token boundaries).\n")
    md += ["## Greedy-token agreement", ""] + sections.agreement_section(runs) + [""]
    peak = next((e.manifest.get("peak_bandwidth") for e in runs.engines if e.manifest.get("peak_bandwidth")), {})
    md += ["## How far from the hardware (estimate)", "",
           f"Formula: {bandwidth.FORMULA}. Weights and KV bytes come from the model's safetensors headers and "
           "config.json (an engine that runs another weight format, e.g. a quantized GGUF as shipped: the weight "
           "bytes it reports); activations and overheads are ignored, so this is an estimate.", "",
           f"Measured peak in this run (copy of {peak.get('size_mb', '?')} MB, read + write, best of "
           f"{peak.get('repeats', 3)} on 1 thread and on {peak.get('cpu_threads', '?')}): "
           f"CPU {fmt(peak.get('cpu_gbps'))} GB/s (1 thread {fmt(peak.get('cpu_gbps_1_thread'))}), "
           f"GPU {fmt(peak.get('gpu_gbps'))} GB/s."
           + (f" Read before each engine: {len(peak['readings'])} readings, {fmt(min(peak['readings']))} to "
              f"{fmt(max(peak['readings']))} GB/s; every floor below uses the best."
              if len(peak.get("readings") or []) > 1 else ""), "",
           ceiling_line(runs), ""]
    md += group(runs, BANDWIDTH) + [""]
    md += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in pngs] + [""]
    md += ["## Config", ""]
    for d, cfg, toml in runs.configs:
        md += [f"`{d}/config.toml`:", "", "```toml", toml.strip() or "(missing)", "```", ""]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path
