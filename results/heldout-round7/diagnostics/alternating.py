"""Round 7 diagnostic, run at 09:37-09:39 before any test-suite measurement (it led to the amendment: the anchor pools
4 turns): mid's and deep's one-row decode steps (768-token prompts) timed five times in turn, and the speed probe
between, against the round's profile as calibrated. Output as printed then: alternating.out.
Run: PYTHONPATH=. python results/heldout-round7/diagnostics/alternating.py"""
from experiments.simulate import probe
from experiments.simulate.step_model import ModelShape, Profile

p = Profile.load("results/heldout-round7/profile.json")
m = ModelShape.from_dir("models/heldout-mid")
for _ in range(5):
    for d in ("models/heldout-mid", "models/heldout-deep"):
        r = probe.one_row(d, p, 2, prompt=768)
        print(r["utc"], d[-4:], round(r["measured_ms"], 1), f"{r['error']:+.1%}", flush=True)
    print("gemm", round(probe.gemm_pass(m, 2) * 1e3, 1), flush=True)
