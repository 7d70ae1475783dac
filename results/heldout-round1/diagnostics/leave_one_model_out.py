"""Leave-one-model-out on fit-suite data only (tiny, small, deep sweeps): which step-model form transfers."""
# python results/heldout-round1/diagnostics/leave_one_model_out.py base|layer  (from the repo root; the small sweep: sweep.sweep on models/heldout-small, 2 threads)
import sys
import numpy as np
from experiments.simulate import calibrate, step_model, sweep
from experiments.simulate.step_model import ModelShape, Profile

FORM = sys.argv[1]
prof0 = Profile.load("results/heldout-round1/profile.json")
if FORM == "layer":
    step_model.TERMS = calibrate.TERMS = step_model.TERMS + ("per_layer",)
    calibrate.REST = calibrate.REST + ("per_layer",)
    f0 = step_model.features
    def features(s, m, prof, tile_rows=None):
        return {**f0(s, m, prof, tile_rows), "per_layer": float(m.layers)}
    step_model.features = calibrate.features = features
both = sweep.load_rows("results/heldout-round1/profile.steps.json")
h = 1562  # tiny's steps, then deep's (its first one-row decode, 65 ms after tiny's 1 ms)
M = {"tiny": ModelShape.from_dir("models/heldout-tiny"), "deep": ModelShape.from_dir("models/heldout-deep"),
     "small": ModelShape.from_dir("models/heldout-small")}
R = {"tiny": both[:h], "deep": both[h:]}
try:
    R["small"] = sweep.load_rows("results/heldout-round1/diagnostics/small.steps.json")
except FileNotFoundError:
    pass
base = Profile(**{**prof0.__dict__, "regimes": {}, "coef": {k: 0.0 for k in step_model.TERMS}})
for fit_on in [("tiny", "deep"), ("tiny", "small"), ("small", "deep"), ("tiny", "small", "deep")]:
    if not all(k in R for k in fit_on):
        continue
    rows = [r for k in fit_on for r in R[k]]
    ms = [M[k] for k in fit_on for _ in R[k]]
    p = calibrate.fit_regimes(rows, ms, base, prof0.fused_max_rows)
    out = []
    for k in R:
        e = calibrate.errors(R[k], M[k], p)
        dec = calibrate.errors([(s, d) for s, d in R[k] if step_model.regime(s, p.fused_max_rows) == "decode"], M[k], p)
        out.append(f"{k}{'*' if k in fit_on else ''}: all {e['median_signed']:+.1%} (|e| {e['median_abs']:.1%}), decode {dec['median_signed']:+.1%}")
    print(FORM, "fit on", "+".join(fit_on), "|", "; ".join(out))
    print("   decode coef", {k: f"{v:.3g}" for k, v in p.regimes["decode"].items()})
