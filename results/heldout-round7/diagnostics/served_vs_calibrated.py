"""Round 7 diagnostic (after the test): the servers' logged steps (closed loop, Poisson) against the profile as
calibrated and against the anchored profile each was predicted with, by regime (median signed error).
Run: PYTHONPATH=. python results/heldout-round7/diagnostics/served_vs_calibrated.py"""
from pathlib import Path

from experiments.simulate import bench
from experiments.simulate.step_model import ModelShape, Profile

R = Path("results/heldout-round7")
shape = ModelShape.from_dir("models/heldout-fir")
for name, tag in (("heldout7_test_closed", "predict"), ("heldout7_test_poisson", "poisson")):
    for label, prof in (("as calibrated", R / "profile.json"), (f"anchored ({tag})", R / f"profile-anchored-{tag}.json")):
        r = bench.served_steps(R / "steps" / f"{name}.jsonl", Profile.load(prof), shape)
        print(name, label, ", ".join(f"{k} {v['steps']} steps {v['median_signed']:+.1%}" for k, v in r.items()
                                     if isinstance(v, dict) and v.get("steps")))
