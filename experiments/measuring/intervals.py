"""Repeats, medians and 95 % intervals, and the rule for naming a winner.

Single runs on a 2-core machine vary by ~30 % between repeats, so a table of single
numbers can rank engines the wrong way. Every number in a report is therefore a median
with a 95 % interval:
- with N >= 2 repeats: the median of the N per-repeat values, and a percentile bootstrap
  of that median over the repeats (with N = 3 the interval is close to [min, max]);
- with one run: the statistic itself, and a percentile bootstrap over the requests
  (latency statistics only: a throughput has one value per run, so it gets no interval, except a
  sustained sweep level's: the bootstrap of the mean over its time windows, `mean_ci`).
A winner is named only where its interval does not overlap the other's.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

B = 2000  # bootstrap resamples
LEVEL = 0.95
SEED = 0


def median_ci(values: Iterable[float], b: int = B, seed: int = SEED) -> tuple[float, float, float] | None:
    """(median, lo, hi) of per-repeat values; bootstrap over the repeats."""
    v = np.asarray([x for x in values if x is not None and x == x], dtype=float)
    if v.size == 0:
        return None
    if v.size == 1:
        return float(v[0]), float(v[0]), float(v[0])
    rng = np.random.default_rng(seed)
    meds = np.median(v[rng.integers(0, v.size, size=(b, v.size))], axis=1)
    lo, hi = np.percentile(meds, [50 * (1 - LEVEL), 100 - 50 * (1 - LEVEL)])
    return float(np.median(v)), float(lo), float(hi)


def mean_ci(values: Iterable[float], b: int = B, seed: int = SEED) -> tuple[float, float, float] | None:
    """(mean, lo, hi) of values from one run (a level's time windows); bootstrap over them. None for fewer than 3."""
    v = np.asarray([x for x in values if x is not None and x == x], dtype=float)
    if v.size < 3:
        return None
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(b, v.size))].mean(axis=1)
    lo, hi = np.percentile(means, [50 * (1 - LEVEL), 100 - 50 * (1 - LEVEL)])
    return float(v.mean()), float(lo), float(hi)


def request_ci(groups: list[np.ndarray], stat: Callable[[np.ndarray], float], b: int = 500,
               seed: int = SEED) -> tuple[float, float] | None:
    """95 % interval of `stat` over the pooled values of `groups` (one array per request),
    resampling whole requests with replacement."""
    groups = [g for g in groups if g.size]
    if len(groups) < 2:
        return None
    rng = np.random.default_rng(seed)
    n = len(groups)
    out = [stat(np.concatenate([groups[i] for i in rng.integers(0, n, size=n)])) for _ in range(b)]
    lo, hi = np.percentile(out, [50 * (1 - LEVEL), 100 - 50 * (1 - LEVEL)])
    return float(lo), float(hi)


def _numeric(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def merge(per_repeat: list[dict[str, Any]], ci: dict[str, list[float]], path: str = "") -> dict[str, Any]:
    """One summary out of several: every numeric leaf becomes the median over the repeats
    (its interval goes to `ci[path]`); anything else is taken from the first repeat."""
    out: dict[str, Any] = {}
    keys = list(dict.fromkeys(k for d in per_repeat for k in d))
    for k in keys:
        vals = [d.get(k) for d in per_repeat]
        first = next((v for v in vals if v is not None), None)
        p = f"{path}.{k}" if path else str(k)
        if isinstance(first, dict):
            out[k] = merge([v if isinstance(v, dict) else {} for v in vals], ci, p)
        elif _numeric(first):
            m = median_ci(v for v in vals if _numeric(v))
            out[k] = m[0] if m else None
            if m:
                ci[p] = [m[1], m[2]]
        else:
            out[k] = first
    return out


def get(d: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def winner(cands: dict[str, tuple[float, float, float]], higher_is_better: bool) -> dict[str, Any]:
    """cands: engine -> (median, lo, hi). The best median, and which engines it beats with
    non-overlapping intervals; `winner` is None when it beats none of them."""
    cands = {k: v for k, v in cands.items() if v is not None and v[0] is not None}
    if len(cands) < 2:
        return {"winner": None, "beats": [], "ties": list(cands)}
    best = (max if higher_is_better else min)(cands, key=lambda k: cands[k][0])
    bm, blo, bhi = cands[best]
    beats = [k for k, (m, lo, hi) in cands.items() if k != best and not overlap((blo, bhi), (lo, hi))]
    ties = [k for k in cands if k != best and k not in beats]
    return {"winner": best if beats else None, "beats": beats, "ties": ties}
