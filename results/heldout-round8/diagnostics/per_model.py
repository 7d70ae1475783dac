"""Round 8 diagnostic, after the test: the one-row probe (probe.one_row: a fresh engine in this process, 768-token
prompts, 48 tokens) of the held-out model and the three fit models past the cache, against the profile as calibrated,
twice in turn: is the slow speed the machine's (every model) or the fit models' (the anchor's)?
Run: PYTHONPATH=. .venv/bin/python results/heldout-round8/diagnostics/per_model.py"""
from experiments.simulate import probe
from experiments.simulate.step_model import Profile

prof = Profile.load("results/heldout-round8/profile.json")
for _ in range(2):
    for m in ("ash", "mid", "deep", "wide"):
        c = probe.one_row(f"models/heldout-{m}", prof, 2, prompt=768)
        print(f"{c['utc']} {m}: {c['measured_ms']:.1f} ms measured, {c['predicted_ms']:.1f} ms as calibrated "
              f"({c['error']:+.1%})", flush=True)
