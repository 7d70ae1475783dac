"""The report's "Predicted vs measured" section: a simulated run (`inferlab simulate`, its manifest
marked `simulated`) beside a measured run of the same engine, merged with `inferlab report MEASURED
SIMULATED`. Per common level: p50/p90/p99 of TTFT, TPOT and E2EL and the output throughput, each
with the signed error (predicted / measured - 1); the SLO searches' capacities when both searched;
one CDF plot per metric (measured solid, predicted dashed).

Each latency error carries a 95 % bootstrap interval (`interval`): the measured requests resampled within
server processes resampled (a level measured in several fresh processes varies between them as much as
within one), the predicted requests resampled, the error recomputed each time; and whether a 10 % bar is
resolvable at that sample size (the interval's half-width under 10 %). An error whose interval spans the bar
both ways says the sample cannot tell.

The SLO search's capacity gets one too (`capacity_interval`, held-out round 6's lesson: a 95 % pass rule over
50-60 requests a level turned a 2 % goodput error into a whole bisection step): each visited level's requests
redrawn at its observed share in SLO, every level judged again by the search's own rule, the capacity read as the
search reads it (the highest passing rate visited), measured and predicted drawn apart, the error recomputed;
resolvable when the interval's half-width is under the capacity bar (15 %), decided when the whole interval lies
within the bar or outside it.

Invariant: nothing here is shown unless a simulated engine and the measured engine it stands for are
both in the runs; every predicted number is labelled with its profile and (un)calibrated.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from experiments.measuring import metrics  # noqa: E402
from experiments.report.md import fmt, table  # noqa: E402

METRICS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2EL"))
STATS = (("median", "p50"), ("p90", "p90"), ("p99", "p99"))


def pairs(runs) -> list[tuple[Any, Any]]:
    """(measured, simulated) engine results: a simulated engine and the measured one it names."""
    out = []
    for s in runs.engines:
        sim = s.manifest.get("simulated")
        if not sim:
            continue
        m = next((e for e in runs.engines if not e.manifest.get("simulated") and e.name == sim["engine"]), None)
        if m is not None:
            out.append((m, s))
    return out


def signed(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else pred / meas - 1


def errors(meas: dict[str, Any], pred: dict[str, Any]) -> dict[str, float | None]:
    """Signed relative errors of one level: "ttft_p50", ..., "e2el_p99", "throughput"."""
    out = {f"{k.removesuffix('_ms')}_{n}": signed((pred.get(k) or {}).get(s), (meas.get(k) or {}).get(s))
           for k, _ in METRICS for s, n in STATS}
    out["throughput"] = signed(pred.get("output_throughput"), meas.get("output_throughput"))
    return out


BAR = 0.10  # the simulator's bar per load (issue 61): resolvable when the interval's half-width is under it
BOOT = 400


def _stat(v: np.ndarray, st: str) -> float:
    return float(np.median(v)) if st == "median" else float(np.percentile(v, float(st[1:])))


def interval(meas: list[dict], pred: list[dict], key: str, st: str, seed: int = 0) -> tuple[float, float] | None:
    """95 % bootstrap interval of the signed error of statistic `st` of `key` (module docstring)."""
    groups: dict[Any, list[float]] = {}
    for r in meas:
        v = metrics.per_request(r)[key]
        if v == v:
            groups.setdefault(r.get("repeat", 1), []).append(v)
    p = np.array([v for v in (metrics.per_request(r)[key] for r in pred) if v == v])
    if not groups or p.size == 0:
        return None
    rng, procs, errs = np.random.default_rng(seed), [np.array(g) for g in groups.values()], []
    for _ in range(BOOT):
        chosen = [procs[i] for i in rng.integers(0, len(procs), len(procs))]
        m = np.concatenate([g[rng.integers(0, g.size, g.size)] for g in chosen])
        errs.append(_stat(p[rng.integers(0, p.size, p.size)], st) / _stat(m, st) - 1)
    lo, hi = np.percentile(errs, [2.5, 97.5])
    return float(lo), float(hi)


CAP_BAR = 0.15  # the capacity's bar (issue 61)


def capacities(search: dict, draws: int, rng: np.random.Generator) -> np.ndarray:
    """`draws` capacities of one search (its manifest's `search`: points with rate, requests, goodput_fraction;
    target): each level's count in SLO redrawn binomially at its share, the highest passing rate (0 if none)."""
    pts = [p for p in search.get("points") or [] if p.get("requests")]
    if not pts:
        return np.zeros(draws)
    rates = np.array([p["rate"] for p in pts])
    n = np.array([p["requests"] for p in pts])
    share = np.array([round(p["goodput_fraction"] * p["requests"]) for p in pts]) / n
    passed = rng.binomial(n, share, size=(draws, len(pts))) / n >= search["target"] - 1e-12  # (draws, levels)
    return np.where(passed, rates, 0.0).max(axis=1)


def capacity_interval(meas: dict, pred: dict, seed: int = 0) -> dict:
    """The capacity error (predicted / measured - 1) of two searches with its 95 % bootstrap interval, each side's
    95 % interval, whether the 15 % bar is resolvable (module docstring), and `decided`: "met" or "missed" where the
    whole interval lies within or outside the bar, "undecided" where it spans the bar's edge."""
    rng = np.random.default_rng(seed)
    m, p = capacities(meas, BOOT * 5, rng), capacities(pred, BOOT * 5, rng)
    ok = m > 0
    err = p[ok] / m[ok] - 1
    out = {"measured": meas.get("best_rate"), "predicted": pred.get("best_rate"),
           "error": signed(pred.get("best_rate"), meas.get("best_rate")),
           "measured_interval": [float(v) for v in np.percentile(m, [2.5, 97.5])],
           "predicted_interval": [float(v) for v in np.percentile(p, [2.5, 97.5])], "interval": None,
           "resolvable": False}
    if err.size:
        lo, hi = np.percentile(err, [2.5, 97.5])
        out.update(interval=[float(lo), float(hi)], resolvable=bool((hi - lo) / 2 < CAP_BAR),
                   decided="met" if -CAP_BAR <= lo and hi <= CAP_BAR else
                   "missed" if hi < -CAP_BAR or lo > CAP_BAR else "undecided")
    return out


def _ci(ci: tuple[float, float] | None) -> list[str]:
    if ci is None:
        return ["–", "–"]
    return [f"[{ci[0]:+.1%}, {ci[1]:+.1%}]", "yes" if (ci[1] - ci[0]) / 2 < BAR else "no"]


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:+.1%}"


def section(runs, out: Path) -> list[str]:
    ps = pairs(runs)
    if not ps:
        return []
    md = ["## Predicted vs measured", ""]
    for m, s in ps:
        sim = s.manifest["simulated"]
        md += [f"**{s.label}** predicts **{m.label}** with profile {sim['profile']}"
               + ("" if sim.get("calibrated") else " (UNCALIBRATED: spec sheet, no measurement behind it)")
               + f"; answer lengths: {sim.get('eos_lengths')}. Error = predicted / measured - 1.", ""]
        rows = []
        for level in [lv for lv in runs.levels if lv in m.summary and lv in s.summary]:
            mp, sp = m.summary[level], s.summary[level]
            e = errors(mp, sp)
            for k, name in METRICS:
                for st, n in STATS:
                    rows.append([level, f"{name} {n} (ms)", fmt((mp.get(k) or {}).get(st)),
                                 fmt((sp.get(k) or {}).get(st)), _pct(e[f"{k.removesuffix('_ms')}_{n}"]),
                                 *_ci(interval(m.records.get(level) or [], s.records.get(level) or [], k, st))])
            rows.append([level, "output tok/s", fmt(mp.get("output_throughput")), fmt(sp.get("output_throughput")),
                         _pct(e["throughput"]), "–", "–"])
        md += table(["level", "metric", "measured", "predicted", "error", "95 % interval", "10 % resolvable"], rows) \
            if rows else \
            ["No level in common (a search picks its own rates): see the capacities below."]
        caps = [((e.manifest.get("repeats") or {}).get("1") or {}).get("search") for e in (m, s)]
        if all(c and c.get("best_rate") for c in caps):
            c = capacity_interval(*caps)
            md += ["", f"SLO search capacity: measured {fmt(c['measured'])} req/s (95 % interval "
                   f"{fmt(c['measured_interval'][0])}-{fmt(c['measured_interval'][1])}), predicted {fmt(c['predicted'])} "
                   f"req/s ({fmt(c['predicted_interval'][0])}-{fmt(c['predicted_interval'][1])}): {_pct(c['error'])}"
                   + (f" [{c['interval'][0]:+.1%}, {c['interval'][1]:+.1%}], 15 % "
                      f"{'resolvable' if c['resolvable'] else 'not resolvable'}, {c['decided']}" if c["interval"] else "")
                   + "."]
        md += [""] + [f"![{p.stem}](plots/{p.name})" for p in plot(m, s, runs.levels, out)] + [""]
    return md


def plot(m, s, levels: list[str], out: Path) -> list[Path]:
    """One CDF per metric: each common level's measured (solid) and predicted (dashed) requests."""
    paths = []
    common = [lv for lv in levels if m.records.get(lv) and s.records.get(lv)]
    for key, name in METRICS:
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, lv in enumerate(common):
            colour = f"C{i % 10}"
            for e, style, tag in ((m, "-", "measured"), (s, "--", "predicted")):
                v = np.sort([r[key] for r in map(metrics.per_request, e.records[lv]) if r[key] == r[key]])
                if v.size:
                    ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", color=colour, linestyle=style,
                            label=f"{lv} {tag}")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{name}: measured (solid) vs predicted (dashed)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
        fig.tight_layout()
        path = out / f"predicted_{key.removesuffix('_ms')}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
