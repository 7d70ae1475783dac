"""`inferlab simulate --calibrate CONFIG`: fit the step-time model's coefficients on this machine.

The fit minimizes the relative error of predicted step times, sum(((pred - t) / t)^2), over the
sweep's steps, with every coefficient >= 0 (a term that would need a negative weight is dropped and
the rest refitted). With one model the weight-read term and the per-step overhead are the same
column (every step reads the same weights), so the per-step overhead is folded into `weights`:
say so in the profile's notes. Residuals (median and p90 of |relative error|) go into `fit`.
"""
from __future__ import annotations

import platform
import subprocess
from datetime import date
from typing import Any

import numpy as np

from experiments.simulate.step_model import TERMS, ModelShape, Profile, StepShape, features, predict

FOLDED = "per_step"  # collinear with `weights` when one model is calibrated


def fit(rows: list[tuple[StepShape, float]], m: ModelShape, prof: Profile,
        terms: tuple[str, ...] = tuple(t for t in TERMS if t != FOLDED)) -> dict[str, float]:
    """Non-negative relative least squares of the measured seconds on the profile's features."""
    X = np.array([[features(s, m, prof)[k] for k in terms] for s, _ in rows])
    t = np.array([d for _, d in rows])
    A, b = X / t[:, None], np.ones(len(t))
    keep = list(range(len(terms)))
    while True:
        sol, *_ = np.linalg.lstsq(A[:, keep], b, rcond=None)
        if (sol >= 0).all():
            break
        keep = [k for k, v in zip(keep, sol) if v >= 0] if (sol > 0).any() else keep[:1]
    coef = {k: 0.0 for k in TERMS}
    for k, v in zip(keep, sol):
        coef[terms[k]] = float(v)
    return coef


def errors(rows: list[tuple[StepShape, float]], m: ModelShape, prof: Profile) -> dict[str, Any]:
    """Relative errors (pred / measured - 1) of a profile on timed steps: median, p90 of |e|, signed median."""
    e = np.array([predict(s, m, prof) / d - 1 for s, d in rows])
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
              engine: str, notes: str = "") -> Profile:
    """A calibrated profile from timed steps, at the measured peaks (so each a = 1 / efficiency)."""
    prof = Profile(name=f"{engine} on {platform.node()}", bandwidth_gbps=bandwidth_gbps,
                   tflops={m.dtype: tflops}, coef={k: 0.0 for k in TERMS}, calibrated=True, machine=machine(),
                   engine=engine, version=commit(), date=date.today().isoformat(),
                   notes=("per-step overhead folded into `weights` (one model: the same column). " + notes).strip())
    prof.coef = fit(rows, m, prof)
    prof.fit = {"sweep": errors(rows, m, prof),
                "shapes": sorted({(len(s.seqs), max(n for n, _, _ in s.seqs)) for s, _ in rows})[:64]}
    return prof
