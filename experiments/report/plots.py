"""PNG plots for the report (matplotlib, Agg backend: no display needed).

Latency CDFs (one figure per metric, a line per engine and load level), per engine
output throughput and median TTFT against the swept concurrency or rate, and for an SLO
search the share of requests meeting the SLOs against the rate.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import numpy as np  # noqa: E402

from adapters import registry  # noqa: E402
from experiments.measuring import metrics  # noqa: E402
from experiments.report.summary import Runs  # noqa: E402

CDF_METRICS = {"ttft_ms": "TTFT (ms)", "tpot_ms": "TPOT (ms)", "itl_ms": "ITL (ms)", "e2el_ms": "E2EL (ms)"}
# One colour per engine in every plot of every report (its spec's, matplotlib's tab10); a label that is not a
# registered engine (a variant, or the same engine from a second run folder) takes the next spare one.
SPARE_COLOURS = ("tab:gray", "tab:olive", "tab:cyan", "black", "gold", "navy", "lime", "teal", "maroon", "coral")
LEVEL_STYLES = ("-", "--", ":", "-.")  # several load levels of one engine in one CDF plot


def colours(runs: Runs) -> dict[str, str]:
    """Engine label -> its colour, the same for every plot of this report."""
    return colour_map([e.label for e in runs.engines])


def colour_map(labels: list[str]) -> dict[str, str]:
    """Label -> colour: a registered engine's own (its spec's), else the next spare one."""
    out: dict[str, str] = {}
    spare = iter(SPARE_COLOURS * (1 + len(labels) // len(SPARE_COLOURS)))
    for label in dict.fromkeys(labels):
        spec = registry.spec(label)
        fixed = spec.colour if spec is not None else None
        out[label] = fixed if fixed is not None and fixed not in out.values() else next(spare)
    return out


def _values(recs: list[dict], key: str) -> np.ndarray:
    rows = [metrics.per_request(r) for r in recs]
    vals = [v for row in rows for v in row["itl_ms"]] if key == "itl_ms" else [row[key] for row in rows]
    return np.sort(np.asarray([v for v in vals if v == v], dtype=float))


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def latency_cdfs(runs: Runs, out: Path) -> list[Path]:
    paths, colour = [], colours(runs)
    for key, label in CDF_METRICS.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn = 0
        for e in runs.engines:
            for i, level in enumerate(runs.levels):
                v = _values(e.records.get(level, []), key)
                if v.size:
                    tag = e.label if len(runs.levels) == 1 else f"{e.label} {level}"
                    ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=tag, color=colour[e.label],
                            linestyle=LEVEL_STYLES[i % len(LEVEL_STYLES)])
                    drawn += 1
        if drawn:
            ax.set_xlabel(label)
            ax.set_ylabel("fraction of " + ("tokens" if key == "itl_ms" else "requests"))
            ax.set_title(f"{label.split()[0]} CDF")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            paths.append(_save(fig, out / f"cdf_{key.removesuffix('_ms')}.png"))
        plt.close(fig)
    return paths


def _x(level: str) -> float:
    v = float(level.partition("=")[2])
    return v


def sweep_figure(runs: Runs, key: str, ylabel: str) -> tuple[plt.Figure, str]:
    """One metric against the load level, a line per engine in its report colour; the x axis
    ticks only at the measured levels (a concurrency of 1.5 was never run)."""
    kind = runs.levels[0].partition("=")[0]
    levels = [lv for lv in runs.levels if lv.startswith(kind + "=")]
    finite = [_x(lv) for lv in levels if math.isfinite(_x(lv))]
    inf_at = (max(finite) * 2 if finite else 1.0)  # where rate=inf is drawn
    colour, drawn = colours(runs), set()
    fig, ax = plt.subplots(figsize=(6, 4))
    for e in runs.engines:
        xs, ys = [], []
        for lv in levels:
            s = e.summary.get(lv)
            if not s:
                continue
            y = s["ttft_ms"]["median"] if key == "ttft_median" else s.get(key)
            if y is not None:
                x = _x(lv)
                xs.append(x if math.isfinite(x) else inf_at)
                ys.append(y)
        if xs:
            ax.plot(xs, ys, marker="o", label=e.label, color=colour[e.label])
            drawn.update(xs)
    ticks = sorted(drawn)
    ax.set_xticks(ticks, [("inf" if x == inf_at and len(finite) < len(levels) else f"{x:g}") for x in ticks])
    ax.minorticks_off()
    ax.set_xlabel(kind)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{ylabel} vs {kind}")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    return fig, kind


def sweep(runs: Runs, out: Path) -> list[Path]:
    """Output throughput and median TTFT against the load level, one line per engine."""
    if not runs.levels:
        return []
    paths = []
    for key, ylabel, fname in (("output_throughput", "output tokens/s", "throughput"),
                               ("ttft_median", "median TTFT (ms)", "ttft")):
        fig, kind = sweep_figure(runs, key, ylabel)
        paths.append(_save(fig, out / f"{fname}_vs_{kind}.png"))
        plt.close(fig)
    return paths


def search(runs: Runs, out: Path) -> list[Path]:
    """Share of requests meeting the SLOs against the rate, per engine (load.mode = "search")."""
    fig, ax = plt.subplots(figsize=(6, 4))
    target, colour = None, colours(runs)
    for e in runs.engines:
        pts = sorted((p["rate"], p["goodput_fraction"]) for r in (e.manifest.get("repeats") or {}).values()
                     for p in (r.get("search") or {}).get("points", []))
        target = target or next((r["search"]["target"] for r in (e.manifest.get("repeats") or {}).values()
                                 if r.get("search")), None)
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=e.label, color=colour[e.label])
    if not ax.lines:
        plt.close(fig)
        return []
    ax.axhline(target, color="grey", linestyle="--", label=f"target {target:.0%}")
    ax.set_xlabel("Poisson rate (requests/s)")
    ax.set_ylabel("share of requests meeting every SLO")
    ax.set_title("goodput vs rate (SLO search)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    p = _save(fig, out / "goodput_vs_rate.png")
    plt.close(fig)
    return [p]
