"""`inferlab simulate --calibrate CONFIG`: fit the step-time model's coefficients on this machine.

Per regime (step_model.regime: the dispatch table's path for the step's shape) the fit minimizes the
relative error of predicted step times, sum(((pred - t) / t)^2), with every coefficient >= 0 (a term
that would need a negative weight is dropped and the rest refitted). The overlapped pair
max(a_w * W, a_lin * F) is not linear in its coefficients: for each ratio r = a_lin / a_w on a log
grid the column max(W, r * F) is, so the fit is a one-dimensional search over r with a non-negative
least squares inside; the best r wins. The tile padding of the linear rows (1 or the GEMM's 12) is
chosen the same way, by the sweep's own error. Residuals (median and p90 of |relative error|) go
into `fit`: on the sweep only; the validation (the teacher-forced trace) never feeds a coefficient.
"""
from __future__ import annotations

import platform
import subprocess
from datetime import date
from typing import Any

import numpy as np

from experiments.simulate.step_model import (TERMS, ModelShape, Profile, StepShape, combine, features, predict,
                                             regime)

FOLDED = "per_step"  # collinear with `weights` when one model is calibrated (summed form only)
RATIOS = np.geomspace(1e-3, 1e3, 241)
TILES = (1, 12)  # linear rows unpadded, or padded to the AVX-512 panel GEMM's register tile (cpp_gemm.py)


def _nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with the negative coefficients dropped and the rest refitted."""
    keep = list(range(A.shape[1]))
    while True:
        sol, *_ = np.linalg.lstsq(A[:, keep], b, rcond=None)
        if (sol >= 0).all():
            break
        keep = [k for k, v in zip(keep, sol) if v >= 0] if (sol > 0).any() else keep[:1]
    out = np.zeros(A.shape[1])
    out[keep] = sol
    return out


def fit(rows: list[tuple[StepShape, float]], m: ModelShape, prof: Profile,
        terms: tuple[str, ...] = tuple(t for t in TERMS if t != FOLDED)) -> dict[str, float]:
    """The summed form: non-negative relative least squares of the measured seconds on the features."""
    X = np.array([[features(s, m, prof)[k] for k in terms] for s, _ in rows])
    t = np.array([d for _, d in rows])
    sol = _nnls(X / t[:, None], np.ones(len(t)))
    coef = {k: 0.0 for k in TERMS}
    coef.update({k: float(v) for k, v in zip(terms, sol)})
    return coef


REST = ("per_step", "kv", "attention", "per_seq")


def fit_regime(rows: list[tuple[StepShape, float]], m: ModelShape, prof: Profile, tile: int,
               fixed: dict[str, float] | None = None) -> dict[str, float]:
    """One regime's coefficients in the overlapped form (module docstring); `fixed` terms (of REST)
    are held at the given values and the rest fitted to what they leave."""
    fixed = fixed or {}
    F = [features(s, m, prof, tile) for s, _ in rows]
    t = np.array([d - sum(v * f[k] for k, v in fixed.items()) for (_, d), f in zip(rows, F)])
    t = np.maximum(t, 1e-9)
    w, lin = np.array([f["weights"] for f in F]), np.array([f["linear"] for f in F])
    free = [k for k in REST if k not in fixed]
    rest = np.array([[f[k] for k in free] for f in F]).reshape(len(F), len(free))
    best = None
    for r in RATIOS:
        A = np.column_stack([np.maximum(w, r * lin), rest]) / t[:, None]
        sol = _nnls(A, np.ones(len(t)))
        err = float(np.sum((A @ sol - 1) ** 2))
        if best is None or err < best[0]:
            best = (err, r, sol)
    _, r, sol = best
    return {"weights": float(sol[0]), "linear": float(sol[0] * r), **{k: float(v) for k, v in zip(free, sol[1:])},
            **{k: float(v) for k, v in fixed.items()}}


def fit_regimes(rows: list[tuple[StepShape, float]], m: ModelShape, prof: Profile, fused_max_rows: int,
                share_kv: bool = False) -> Profile:
    """`prof` with `regimes` (and `tile_rows`, `fused_max_rows`) fitted on the timed steps. `share_kv`:
    the "mixed" regime takes the "decode" regime's KV coefficient instead of fitting one (when its
    steps are prefills only, as a sweep timed from outside gives: their context then equals their new
    tokens, and the KV column is the linear one, not identifiable)."""
    best = None
    for tile in TILES:
        cand = Profile(**{**prof.__dict__, "tile_rows": tile, "fused_max_rows": fused_max_rows, "regimes": {}})
        groups: dict[str, list] = {}
        for s, d in rows:
            groups.setdefault(regime(s, fused_max_rows), []).append((s, d))
        cand.regimes = {g: fit_regime(rs, m, cand, tile) for g, rs in groups.items() if g == "decode" or not share_kv}
        if share_kv and "mixed" in groups:
            cand.regimes["mixed"] = fit_regime(groups["mixed"], m, cand, tile, {"kv": cand.regimes["decode"]["kv"]})
        e = errors(rows, m, cand)
        if best is None or e["median_abs"] + e["p90_abs"] < best[0]:
            best = (e["median_abs"] + e["p90_abs"], cand)
    return best[1]


def errors(rows: list[tuple[StepShape, float]], m: ModelShape, prof: Profile, served: bool = False) -> dict[str, Any]:
    """Relative errors (pred / measured - 1) of a profile on timed steps: median, p90 of |e|, signed median.
    `served`: the steps ran in a served engine, so each prediction carries the profile's served step terms."""
    from experiments.simulate.served_overhead import served_step

    e = np.array([(served_step(prof, predict(s, m, prof), len(s.seqs)) if served else predict(s, m, prof)) / d - 1
                  for s, d in rows])
    if e.size == 0:
        return {"steps": 0}
    return {"steps": int(e.size), "median_abs": float(np.median(np.abs(e))),
            "p90_abs": float(np.percentile(np.abs(e), 90)), "median_signed": float(np.median(e))}


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor() or "cpu")
    import os

    return f"{platform.node()}: {cpu}, {os.cpu_count()} cores"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def calibrate(rows: list[tuple[StepShape, float]], m: ModelShape, bandwidth_gbps: float, tflops: float,
              engine: str, notes: str = "", fused_max_rows: int = 0, share_kv: bool = False) -> Profile:
    """A calibrated profile from timed steps, at the measured peaks (so each a = 1 / efficiency): the
    per-regime overlapped form, with the summed form's coefficients kept in `coef` for comparison."""
    prof = Profile(name=f"{engine} on {platform.node()}", bandwidth_gbps=bandwidth_gbps,
                   tflops={m.dtype: tflops}, coef={k: 0.0 for k in TERMS}, calibrated=True, machine=machine(),
                   engine=engine, version=commit(), date=date.today().isoformat(), notes=notes)
    prof.coef = fit(rows, m, prof)
    summed = errors(rows, m, prof)
    prof = fit_regimes(rows, m, prof, fused_max_rows, share_kv)
    counts: dict[str, int] = {}
    for s, _ in rows:
        counts[regime(s, fused_max_rows)] = counts.get(regime(s, fused_max_rows), 0) + 1
    prof.fit = {"sweep": errors(rows, m, prof), "sweep_summed_form": summed, "steps_per_regime": counts,
                "shapes": sorted({(len(s.seqs), max(n for n, _, _ in s.seqs)) for s, _ in rows})[:64]}
    return prof


__all__ = ["fit", "fit_regime", "fit_regimes", "errors", "calibrate", "combine"]
