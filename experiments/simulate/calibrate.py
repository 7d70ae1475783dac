"""`inferlab simulate --calibrate CONFIG`: fit the step-time model's coefficients on this machine.

Per regime (step_model.regime: the dispatch table's path for the step's shape) the fit minimizes the
relative error of predicted step times, sum(((pred - t) / t)^2), with every coefficient >= 0 (a term
that would need a negative weight is dropped and the rest refitted). The overlapped pair
max(a_w * W, a_lin * F) is not linear in its coefficients: for each ratio r = a_lin / a_w on a log
grid the column max(W, r * F) is, so the fit is a one-dimensional search over r with a non-negative
least squares inside; the best r wins. The tile padding of the linear rows (1 or the GEMM's 12) is
chosen the same way, by the sweep's own error. Residuals (median and p90 of |relative error|) go
into `fit`: on the sweep only; the validation (the teacher-forced trace) never feeds a coefficient.

Several models at once (`m` a list, one shape per row: `inferlab simulate --calibrate --also-model DIR`):
on one model the weight read is the same bytes every step, so a fixed cost per step and the bandwidth term
are the same column and the fit may put the weight read into the constant (round 6: 20.5 ms a step, and a
weight coefficient of 0.0005, so a model 50x larger was predicted as fast). Fitted together on models whose
weight bytes differ 10x or more, the constant is shared and the weight term must carry the difference;
`shares` prints each term's part of a decode step at 1 and 64 rows, per model, to show it did.

The per-layer cost (step_model.py's `c_layer`) needs a third, independent (layers, weight bytes) point: on
models of one width a layer's bytes are fixed, so layers and weight bytes move together, and with two models a
constant, a per-layer cost and the bandwidth term are three unknowns on two points. `identifiable` keeps
`per_layer` out of the fit (at 0) unless the models' rows [1, layers, weight bytes] have rank 3, as three models of
at least two widths give (held-out round 2: tiny, deep and wide).
"""
from __future__ import annotations

import platform
import subprocess
from datetime import date
from typing import Any, Sequence

import numpy as np

from experiments.simulate.step_model import (AS_KV, TERMS, ModelShape, Profile, StepShape, coefficient, combine,
                                             features, predict, regime)

FOLDED = "per_step"  # collinear with `weights` when one model (past the cache) is calibrated (summed form only)
ADDED = "linear_add"  # the overlapped form's: in the summed form it is `linear` again
LAYERED = "per_layer"  # fitted only where the models tell it apart from the weights and the constant
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


Models = ModelShape | Sequence[ModelShape]  # one shape for every row, or one per row


def per_row(rows: list, m: Models) -> list[ModelShape]:
    """The model shape of each row."""
    if isinstance(m, ModelShape):
        return [m] * len(rows)
    if len(m) != len(rows):
        raise ValueError(f"{len(m)} model shapes for {len(rows)} timed steps")
    return list(m)


def identifiable(ms: Sequence[ModelShape], cache_bytes: float = 0.0) -> int:
    """The rank of the rows [1, layers, weight bytes] of the models past the cache (`cache_bytes`; all of them where
    none is): 1 (one model: the weight read and any constant are one column), 2 (a constant and the bytes apart), 3
    (a per-layer cost apart too). A model whose weights fit in the cache has its own column ("cached"), so it tells
    nothing about the memory's bandwidth (round 4: docs/perf/2026-12-07-heldout-round4.md)."""
    past = [mi for mi in ms if mi.weight_bytes > cache_bytes] or list(ms)
    pts = {(1.0, float(mi.layers), mi.weight_bytes / 1e9) for mi in past}
    return int(np.linalg.matrix_rank(np.array(sorted(pts)), tol=1e-6)) if pts else 0


def fit(rows: list[tuple[StepShape, float]], m: Models, prof: Profile,
        terms: tuple[str, ...] | None = None) -> dict[str, float]:
    """The summed form: non-negative relative least squares of the measured seconds on the features. With one
    model the per-step constant is folded into the weights (the same column); with several it is fitted, and the
    per-layer cost with models of rank 3 (`identifiable`)."""
    ms = per_row(rows, m)
    if terms is None:
        rank = identifiable(ms, prof.cache_bytes)
        terms = tuple(t for t in TERMS if (t != FOLDED or rank > 1) and (t != LAYERED or rank > 2) and t != ADDED)
    unshared = not any(s.shared for s, _ in rows)  # no shared read to fit: it costs what a KV read does (AS_KV)
    terms = tuple(t for t in terms if not (t == AS_KV and unshared))
    X = np.array([[features(s, mi, prof)[k] for k in terms] for (s, _), mi in zip(rows, ms)])
    t = np.array([d for _, d in rows])
    sol = _nnls(X / t[:, None], np.ones(len(t)))
    coef = {k: 0.0 for k in TERMS}
    coef.update({k: float(v) for k, v in zip(terms, sol)})
    if unshared:
        coef[AS_KV] = coef["kv"]
    return coef


REST = ("per_step", "cached", "kv", "kv_shared", "linear_add", "attention", "per_seq", "per_layer")


def fit_regime(rows: list[tuple[StepShape, float]], m: Models, prof: Profile, tile: int,
               fixed: dict[str, float] | None = None) -> dict[str, float]:
    """One regime's coefficients in the overlapped form (module docstring); `fixed` terms (of REST)
    are held at the given values and the rest fitted to what they leave (the per-layer cost held at 0 unless
    the regime's models identify it)."""
    ms = per_row(rows, m)
    rank = identifiable(ms, prof.cache_bytes)
    fixed = {**({} if rank > 2 else {LAYERED: 0.0}), **(fixed or {})}
    F = [features(s, mi, prof, tile) for (s, _), mi in zip(rows, ms)]
    t = np.array([d - sum(v * f[k] for k, v in fixed.items()) for (_, d), f in zip(rows, F)])
    t = np.maximum(t, 1e-9)
    w, lin = np.array([f["weights"] for f in F]), np.array([f["linear"] for f in F])
    unshared = not any(s.shared for s, _ in rows)  # then the shared read takes the KV coefficient (AS_KV)
    free = [k for k in REST if k not in fixed and not (k == AS_KV and unshared)]
    rest = np.array([[f[k] for k in free] for f in F]).reshape(len(F), len(free))
    best = None
    for r in RATIOS:
        A = np.column_stack([np.maximum(w, r * lin), rest]) / t[:, None]
        sol = _nnls(A, np.ones(len(t)))
        err = float(np.sum((A @ sol - 1) ** 2))
        if best is None or err < best[0]:
            best = (err, r, sol)
    _, r, sol = best
    out = {"weights": float(sol[0]), "linear": float(sol[0] * r), **{k: float(v) for k, v in zip(free, sol[1:])},
           **{k: float(v) for k, v in fixed.items()}}
    if unshared and AS_KV not in fixed:
        out[AS_KV] = out["kv"]
    return out


def fit_regimes(rows: list[tuple[StepShape, float]], m: Models, prof: Profile, fused_max_rows: int,
                share_kv: bool = False, fixed: dict[str, dict[str, float]] | None = None) -> Profile:
    """`prof` with `regimes` (and `tile_rows`, `fused_max_rows`) fitted on the timed steps. `share_kv`:
    the "mixed" regime takes the "decode" regime's KV coefficient instead of fitting one (when its
    steps are prefills only, as a sweep timed from outside gives: their context then equals their new
    tokens, and the KV column is the linear one, not identifiable). `fixed`: per regime, terms held at a value
    measured apart (`kernel_attention`) instead of fitted."""
    fixed = fixed or {}
    best = None
    for tile in TILES:
        cand = Profile(**{**prof.__dict__, "tile_rows": tile, "fused_max_rows": fused_max_rows, "regimes": {}})
        groups: dict[str, list] = {}
        models: dict[str, list] = {}
        for (s, d), mi in zip(rows, per_row(rows, m)):
            groups.setdefault(regime(s, fused_max_rows), []).append((s, d))
            models.setdefault(regime(s, fused_max_rows), []).append(mi)
        cand.regimes = {g: fit_regime(rs, models[g], cand, tile, fixed.get(g)) for g, rs in groups.items()
                        if g == "decode" or not share_kv}
        if share_kv and "mixed" in groups:
            cand.regimes["mixed"] = fit_regime(groups["mixed"], models["mixed"], cand, tile,
                                               {**fixed.get("mixed", {}), "kv": cand.regimes["decode"]["kv"]})
        e = errors(rows, m, cand)
        if best is None or e["median_abs"] + e["p90_abs"] < best[0]:
            best = (e["median_abs"] + e["p90_abs"], cand)
    return best[1]


def errors(rows: list[tuple[StepShape, float]], m: Models, prof: Profile, served: bool = False) -> dict[str, Any]:
    """Relative errors (pred / measured - 1) of a profile on timed steps: median, p90 of |e|, signed median.
    `served`: the steps ran in a served engine, so each prediction carries the profile's served step terms."""
    from experiments.simulate.served_overhead import served_step

    e = np.array([(served_step(prof, predict(s, mi, prof), len(s.seqs)) if served else predict(s, mi, prof)) / d - 1
                  for (s, d), mi in zip(rows, per_row(rows, m))])
    if e.size == 0:
        return {"steps": 0}
    return {"steps": int(e.size), "median_abs": float(np.median(np.abs(e))),
            "p90_abs": float(np.percentile(np.abs(e), 90)), "median_signed": float(np.median(e))}


def runs(ms: list[ModelShape]) -> list[list]:
    """[signature, rows] of each contiguous run of one model's rows, in order (how the steps file splits)."""
    out: list[list] = []
    for mi in ms:
        if out and out[-1][0] == mi.signature:
            out[-1][1] += 1
        else:
            out.append([mi.signature, 1])
    return out


RESIDENT = 0.5  # of the last-level cache a model's weights may fill and still be read from it between steps


def resident_bytes() -> int:
    """The weight bytes this machine reads from its last-level cache, not its memory: half the LLC (the rest holds
    the KV, the activations and, in a VM, other tenants' lines). Measured on a 480 MiB L3 (held-out round 4's
    record): `tiny` (24 MB) streams at twice the memory's speed, `small` (403 MB, 0.8x the L3) on the memory's line."""
    return int(llc_bytes() * RESIDENT)


def llc_bytes() -> int:
    """This machine's last-level cache in bytes (sysfs: the highest cache level of cpu0), 0 where unknown."""
    from pathlib import Path

    best = (0, 0)
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level, size = int((d / "level").read_text()), (d / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        best = max(best, (level, int(size.rstrip("KMG")) * unit))
    return best[1]


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


def shares(prof: Profile, m: ModelShape, context: int = 1024) -> dict[str, dict[str, float]]:
    """Each term's part of a decode step of 1 and of 64 rows (contexts of `context`) under the profile, and
    the step's predicted seconds: {"decode x1": {term: share, ..., "seconds": t}, "decode x64": ...}."""
    out = {}
    for rows in (1, 64):
        shape = StepShape(tuple((1, context, 1) for _ in range(rows)))
        f = features(shape, m, prof)
        coef = (prof.regimes.get(regime(shape, prof.fused_max_rows)) or prof.regimes["mixed"]) if prof.regimes \
            else prof.coef
        parts = {k: coefficient(coef, k) * f[k] for k in TERMS}
        if prof.regimes:  # the overlapped pair: only the larger of weights and linear counts
            lo = min(("weights", "linear"), key=lambda k: parts[k])
            parts[lo] = 0.0
        total = sum(parts.values())
        out[f"decode x{rows}"] = {**{k: v / total for k, v in parts.items()}, "seconds": total}
    return out


def calibrate(rows: list[tuple[StepShape, float]], m: Models, bandwidth_gbps: float, tflops: float,
              engine: str, notes: str = "", fused_max_rows: int = 0, share_kv: bool = False,
              cache_bytes: float = 0.0, fixed: dict[str, dict[str, float]] | None = None) -> Profile:
    """A calibrated profile from timed steps, at the measured peaks (so each a = 1 / efficiency): the
    per-regime overlapped form, with the summed form's coefficients kept in `coef` for comparison. `cache_bytes`:
    the machine's last-level cache (`llc_bytes`); a model whose weights fit in it reads them from there. `fixed`:
    per regime, coefficients measured apart and held (the prefill attention kernel's: kernels.py)."""
    dtype = per_row(rows, m)[0].dtype if rows else m.dtype
    prof = Profile(name=f"{engine} on {platform.node()}", bandwidth_gbps=bandwidth_gbps,
                   tflops={dtype: tflops}, coef={k: 0.0 for k in TERMS}, calibrated=True, machine=machine(),
                   cache_bytes=cache_bytes,
                   engine=engine, version=commit(), date=date.today().isoformat(), notes=notes)
    prof.coef = fit(rows, m, prof)
    summed = errors(rows, m, prof)
    prof = fit_regimes(rows, m, prof, fused_max_rows, share_kv, fixed)
    counts: dict[str, int] = {}
    for s, _ in rows:
        counts[regime(s, fused_max_rows)] = counts.get(regime(s, fused_max_rows), 0) + 1
    ms = per_row(rows, m)
    prof.fit = {"sweep": errors(rows, m, prof), "sweep_summed_form": summed, "steps_per_regime": counts,
                "shapes": sorted({(len(s.seqs), max(n for n, _, _ in s.seqs)) for s, _ in rows})[:64],
                "models": {f"{mi.weight_bytes / 1e6:.0f} MB": shares(prof, mi) for mi in dict.fromkeys(ms)},
                "rows_per_model": runs(ms)}
    return prof


__all__ = ["resident_bytes", "llc_bytes", "identifiable", "fit", "fit_regime", "fit_regimes", "errors", "calibrate", "combine", "shares", "per_row"]
