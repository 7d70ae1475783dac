"""Round 7 diagnostic (fit data only): the calibration sweep's steps against the fitted profile, per model and
regime (median signed error, p10 / p90). Run: PYTHONPATH=. python results/heldout-round7/diagnostics/sweep_per_model.py"""
import statistics
from collections import defaultdict

from experiments.simulate import sweep
from experiments.simulate.step_model import ModelShape, Profile, predict, regime

p = Profile.load("results/heldout-round7/profile.json")
rows = sweep.load_rows("results/heldout-round7/profile.steps.json")
shapes = {m.signature: m for m in (ModelShape.from_dir(f"models/heldout-{n}") for n in ("tiny", "deep", "wide", "mid"))}
ms = [shapes[sig] for sig, n in p.fit["rows_per_model"] for _ in range(n)]
err = defaultdict(list)
for (s, t), m in zip(rows, ms):
    r = regime(s, p.fused_max_rows)
    err[(f"{m.layers} x {m.hidden}", r + (" one-row" if r == "decode" and len(s.seqs) == 1 else ""))].append(predict(s, m, p) / t - 1)
for k, v in sorted(err.items()):
    v.sort()
    print(*k, f"{len(v)} steps, median {statistics.median(v):+.1%}, p10 {v[len(v) // 10]:+.1%}, p90 {v[9 * len(v) // 10]:+.1%}")
