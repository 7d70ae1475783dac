"""The report of a matrix config (`cells = [...]`): one table across its cells.

Each cell ran as a run folder of its own (`results/<name>/<cell>/`, with its full report); this
page puts the headline numbers of every cell side by side, with the reference engine's speed as
a ratio to the best other engine's in the same cell, and the greedy-token agreement. Ratios are
within one cell of one run: never across runs or machines.

Ratio convention: > 1 means the reference engine (else the first engine listed) is better
(throughput: ref ÷ other; latency: other ÷ ref), so one column reads the same way for every metric.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adapters import registry
from experiments.measuring.intervals import get
from experiments.report import frontier
from experiments.report.build import wants_frontier
from experiments.report.md import fmt, table
from experiments.report.rows import cell
from experiments.report.summary import agreement, load_runs, summarize
from experiments.report.where import cell_nodes

HEADLINE = (("output tok/s", "output_throughput", "f1", True), ("TTFT p50 (ms)", "ttft_ms.median", "f1", False),
            ("TPOT p50 (ms)", "tpot_ms.median", "f2", False),
            # the copy bandwidth measured in this run: bytes per decode step / GB/s (no ratio: one machine)
            ("bandwidth floor per step (ms)", "ceilings.floor_ms", "f2", None),
            ("TPOT p50 ÷ bandwidth floor", "ceilings.tpot_over_floor", "f2", False))


def speed_ratio(ref: float | None, other: float | None, higher_better: bool) -> float | None:
    """> 1: the reference engine is better on this metric."""
    if not ref or not other:
        return None
    return ref / other if higher_better else other / ref


def _rows(cell_name: str, cfg: dict[str, Any], runs, base: str, own: frozenset = frozenset()) -> list[list[str]]:
    """`own`: variants of `base` (the same adapter, other settings): shown, never the 'best other'."""
    engines = [e for e in runs.engines if e.summary]
    agree = agreement(runs)
    rows = []
    for level in runs.levels:
        for label, path, unit, higher in HEADLINE:
            vals = {e.label: get(e.summary[level], path) if level in e.summary else None for e in engines}
            cells = {e.label: cell(e.summary[level], path, unit) if level in e.summary else "–" for e in engines}
            others = [v for k, v in vals.items() if k != base and k not in own and v is not None]
            best = (max if higher else min)(others) if others else None
            if path.startswith("ceilings.") and all(v is None for v in vals.values()):
                continue  # no bandwidth measured in this run
            r = speed_ratio(vals.get(base), best, higher) if higher is not None else None
            rows.append([cell_name, cfg["dtype"], level, label, " · ".join(f"{k} {c}" for k, c in cells.items()),
                         "–" if r is None else f"**{r:.2f}**"])
        agr = [f"{k} {fmt(v[level]['exact'], 3)} of {v[level]['requests']}" for k, v in agree.items() if level in v]
        if agr:
            rows.append([cell_name, cfg["dtype"], level, f"greedy outputs identical to {base}'s", " · ".join(agr), ""])
    return rows


def build(root: Path, whole, command: str) -> Path:
    """Write root/report.md from the cell folders root/<cell>/ of the matrix config `whole`;
    `command` is what made them, quoted in the page."""
    names = whole.all_engines()
    # the engine the ratios are about: the first whose spec says so (the reference engine), else the first
    base = next((n for n in names if (s := registry.spec(n)) is not None and s.anchor), names[0])
    body, links, cells = [], [], []
    for c in whole.cell_configs():
        d = root / c.name
        if not (d / "config.json").is_file():
            body.append([c.name, c.dtype, "–", "not run", "", ""])
            continue
        runs = load_runs([d])
        summarize(runs)
        cells.append((c.name, runs))
        own = frozenset(n for n in c.all_engines() if n != base and c.adapter(n) == c.adapter(base))
        body += _rows(c.name, {"dtype": c.dtype}, runs, base, own)
        links.append(f"- `{c.name}`: model `{c.model}`, {c.dtype} — [full report]({c.name}/report.md){cell_nodes(runs)}")
    md = [f"# inferlab matrix report: {whole.name}", "",
          f"Generated {datetime.now(timezone.utc).isoformat(timespec='seconds')} by `{command}`.", "",
          "One row per cell, load level and headline metric; every engine's value (median, with its 95 % "
          f"interval where the cell's report has one) and {base}'s speed relative to the best "
          f"other engine in the same cell (**> 1: {base} better**; throughput {base} ÷ other, latency "
          f"other ÷ {base}; a variant of {base} with other settings is shown but never the 'other'). "
          + ("Each (cell, engine) pair ran as a Ray task on the node named under Cells, side by side where nodes "
             "were free" if any(cell_nodes(r) for _, r in cells) else "The cells ran one after another in one "
             "invocation") + "; each cell's report has the "
          "effective settings, memory and fairness flags.", "",
          *table(["cell", "dtype", "level", "metric", "engines", f"{base} ÷ best other"], body), "",
          "## Cells", "", *links, ""]
    cfg = whole.model_dump(mode="json")
    if wants_frontier(cfg):  # the frontier across cells: every cell's levels are one engine's points
        md[md.index("## Cells"):md.index("## Cells")] = frontier.section(cells, cfg, root)
    path = root / "report.md"
    path.write_text("\n".join(md))
    return path
