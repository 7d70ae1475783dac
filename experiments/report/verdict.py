"""Who is faster, said only where the intervals allow it; and the best load under the SLOs.

Per level and headline metric, the engine with the best median is named the winner over
each engine whose 95 % interval does not overlap its own; where every interval overlaps,
the line says "no significant difference". With one run, throughput has no interval, so
it is shown but not ranked.
"""
from __future__ import annotations

from typing import Any

from experiments.measuring import intervals
from experiments.report.md import fmt, table
from experiments.report.summary import Runs

HEADLINE = (("output tokens/s", "output_throughput", True), ("TTFT median (ms)", "ttft_ms.median", False),
            ("TPOT median (ms)", "tpot_ms.median", False))


def basis(runs: Runs) -> str:
    reps = sorted({r for e in runs.engines for s in e.summary.values() for r in s.get("repeats", [1])})
    n = max(reps) if reps else 1
    if n > 1:
        return (f"Every number is the median over {n} repeats (engines interleaved A B A B …, each repeat a cold "
                "start), with a 95 % bootstrap interval over the repeats in brackets.")
    return ("One run per engine: latency statistics carry a 95 % bootstrap interval over the requests in brackets; "
            "throughput has one value per run and so no interval (set `repeats = 3` for intervals on everything).")


def _cand(s: dict[str, Any], path: str) -> tuple[float, float, float] | None:
    v, ci = intervals.get(s, path), (s.get("ci") or {}).get(path)
    return (v, ci[0], ci[1]) if v is not None and ci else None


def lines(runs: Runs) -> list[str]:
    out = []
    for level in runs.levels:
        for label, path, higher in HEADLINE:
            cands = {e.label: _cand(e.summary[level], path) for e in runs.engines if level in e.summary}
            if len(cands) < 2:
                continue
            if any(c is None for c in cands.values()):
                out.append(f"- {level}, {label}: not ranked (no interval for "
                           + ", ".join(k for k, c in cands.items() if c is None) + ")")
                continue
            w = intervals.winner(cands, higher)
            if w["winner"] is None:
                out.append(f"- {level}, {label}: no significant difference ({', '.join(cands)}: intervals overlap)")
            else:
                tie = f"; no significant difference from {', '.join(w['ties'])}" if w["ties"] else ""
                out.append(f"- {level}, {label}: **{w['winner']}** is better than {', '.join(w['beats'])} "
                           f"(intervals do not overlap){tie}")
    return out or ["- only one engine finished requests: nothing to rank"]


def search_section(runs: Runs) -> list[str]:
    """One number per engine: the highest rate meeting the SLOs (median over repeats)."""
    rows = []
    for e in runs.engines:
        found = [r.get("search") for r in (e.manifest.get("repeats") or {}).values() if r.get("search")]
        if not found:
            continue
        best = intervals.median_ci(f["best_rate"] for f in found if f.get("best_rate") is not None)
        fails = [f["failing_rate"] for f in found if f.get("failing_rate") is not None]
        target = found[0].get("target", 0.95)
        # what a million output tokens cost when the machine runs at that rate (cost_per_hour set)
        costs = [(e.summary.get(f"rate={f['best_rate']:g}") or {}).get("cost_per_m_output")
                 for f in found if f.get("best_rate") is not None]
        cost = intervals.median_ci(c for c in costs if c is not None)
        rows.append([e.label, f"{fmt(best[0], 3)} [{fmt(best[1], 3)}–{fmt(best[2], 3)}]" if best else
                     "– (even the lowest rate tried failed)", fmt(min(fails), 3) if fails else "– (never failed)",
                     f"{target:.0%}", str(len(found)), str(sum(len(f["points"]) for f in found)),
                     fmt(cost[0], 3) if cost else "–"])
    if not rows:
        return []
    header = ["engine", "best rate (req/s)", "lowest failing rate", "target", "repeats", "levels run",
              "cost per million output tokens at the best rate"]
    if all(r[-1] == "–" for r in rows):  # no cost_per_hour in the config
        header, rows = header[:-1], [r[:-1] for r in rows]
    level_s = min((r["search"].get("level_s") or 0) for e in runs.engines
                  for r in (e.manifest.get("repeats") or {}).values() if r.get("search"))
    lasting = (f" Each level sent arrivals for at least {level_s:g} s (`load.search.level_s`), so a rate "
               "the engine cannot sustain fails by its queue." if level_s else
               " Each level sent only the workload's requests (`level_s` 0 or a search from before it existed): at "
               "a high rate that is a burst, and the rate found can be far above what the engine sustains.")
    return ["## Best load under the SLOs", "",
            "The highest Poisson rate (requests/s) at which the share of requests meeting every SLO stays at or "
            "above the target, found by doubling then bisection (experiments/running/search.py). The lowest failing rate "
            "bounds it from above: the answer is known to within their difference." + lasting, ""] + \
        table(header, rows) + \
        ["", "![goodput_vs_rate](plots/goodput_vs_rate.png)", ""]
