"""Round 7 diagnostic (after the test): the drift control (mid's one-row decode at 768-token prompts, against the
round's profile as calibrated) timed in fresh processes, then several times in one process that first loaded the
other fit model, as the validate process does. Run: PYTHONPATH=. python results/heldout-round7/diagnostics/fresh_control.py"""
import subprocess
import sys

ONE = """
from experiments.simulate import probe
from experiments.simulate.step_model import Profile
p = Profile.load('results/heldout-round7/profile.json')
for d in {dirs!r}:
    r = probe.one_row(d, p, 2, prompt=768)
    print(f"{{r['utc']}} {{d}}: {{r['measured_ms']:.1f}} ms (as calibrated {{r['predicted_ms']:.1f}}, {{r['error']:+.1%}})", flush=True)
"""
if __name__ == "__main__":
    print("fresh processes, mid alone:")
    for _ in range(3):
        subprocess.run([sys.executable, "-c", ONE.format(dirs=["models/heldout-mid"])], check=True)
    print("one process, deep then mid, three times:")
    subprocess.run([sys.executable, "-c", ONE.format(dirs=["models/heldout-deep", "models/heldout-mid"] * 3)], check=True)
