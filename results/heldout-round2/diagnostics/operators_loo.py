"""Diagnostic for choosing round 3's weight term (run after round 2's test suite was seen: broad is spent, and its
teacher-forced steps are used here only to choose the form, which round 3 then tests on a fresh model).

Today's steps: round 2's calibration sweep (tiny, deep, wide; split at the step where each model's sweep began)
and broad's teacher-forced trace. Each model's decode GEMMs timed in the engine's kernel (operators.py). Fits on
pairs and triples, bytes over bandwidth against the timed passes; the median signed error of each left-out model's
decode steps. Run quiet: `PYTHONPATH=. python results/heldout-round2/diagnostics/operators_loo.py`.

It ran once (01:54, outputs.txt) against a weight term that was then removed, never committed: `calibrate(...,
operators={signature: seconds})` made each model's `weights` feature its timed GEMM pass (now probe.gemm_pass;
the module was `operators.time_pass`) instead of bytes over bandwidth. It predicted the left-out broad worse than
bytes did (+17.9 % against +12.6 % from tiny + deep), so it went, and the pass stayed as the speed probe."""
import json
from pathlib import Path

import numpy as np

from experiments.simulate import operators, sweep
from experiments.simulate.calibrate import calibrate
from experiments.simulate.step_model import ModelShape, predict, regime

R = Path("results/heldout-round2")
rows = sweep.load_rows(R / "profile.steps.json")
cut = [0, 1562, 3172, len(rows)]  # tiny, deep, wide: where each sweep began (one-row steps jump from 1 to 57 ms, then 57 to 36)
data = {n: rows[a:b] for n, a, b in zip(("tiny", "deep", "wide"), cut, cut[1:])}
data["broad"] = [r for c in (1, 4, 8) for r in sweep.load_rows(R / f"trace-c{c}.steps.json")]
shape = {n: ModelShape.from_dir(f"models/heldout-{n}") for n in data}
timed = {}
for n, m in shape.items():
    timed[m.signature] = operators.time_pass(m, 2)
    print(f"{n}: {m.weight_bytes / 1e6:.0f} MB, {m.layers} x {m.hidden}: GEMM pass {timed[m.signature] * 1e3:.2f} ms "
          f"= {m.weight_bytes / timed[m.signature] / 1e9:.1f} GB/s", flush=True)
peaks = json.loads((R / "profile.json").read_text())
bw, fl = peaks["bandwidth_gbps"], list(peaks["tflops"].values())[0]


def err(prof, n):
    e = [predict(s, shape[n], prof) / t - 1 for s, t in data[n] if regime(s, prof.fused_max_rows) == "decode"]
    return float(np.median(e))


out = {"timed_ms": {n: timed[m.signature] * 1e3 for n, m in shape.items()}, "fits": {}}
for fit in (("tiny", "deep"), ("tiny", "wide"), ("deep", "wide"), ("tiny", "deep", "wide")):
    rs = [r for n in fit for r in data[n]]
    ms = [shape[n] for n in fit for _ in data[n]]
    for form, ops in (("bytes", None), ("timed", {shape[n].signature: timed[shape[n].signature] for n in fit})):
        prof = calibrate(rs, ms, bw, fl, "reference", fused_max_rows=128, operators=ops, threads=2)
        if ops:
            prof.operators.update(timed)
        res = {n: err(prof, n) for n in data}
        out["fits"][f"{'+'.join(fit)} {form}"] = res
        print(f"fit {'+'.join(fit):16s} {form:5s}: " + ", ".join(f"{n} {v:+.1%}" + ("" if n in fit else " (left out)")
                                                               for n, v in res.items()), flush=True)
(R / "diagnostics" / "operators_loo.json").write_text(json.dumps(out, indent=1))
