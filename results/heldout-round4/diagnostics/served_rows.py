"""After round 4 was seen (a diagnostic; `python served_rows.py 5` for round 5, after it was seen): the Poisson run's served steps (its step log) against the round's profile with
its served terms, by rows in the step and by kind (all-decode or with a prefill chunk): median signed error, and
each bucket's share of the run's step time."""
import sys

import numpy as np

from experiments.simulate.served_overhead import logged_rows, served_step
from experiments.simulate.step_model import ModelShape, Profile, predict, regime

R = int(sys.argv[1]) if len(sys.argv) > 1 else 4  # the round; its held-out model below
prof = Profile.load(f"results/heldout-round{R}/profile.json")
m = ModelShape.from_dir(f"models/heldout-{ {4: 'stout', 5: 'lean'}[R]}")
rows = logged_rows(f"results/heldout-round{R}/steps/heldout{R}_test_poisson.jsonl")
total = sum(d for _, d in rows)
buckets: dict = {}
for s, d in rows:
    kind = "decode" if all(n == 1 for n, _, _ in s.seqs) else "with prefill"
    b = len(s.seqs)
    edge = next(e for e in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 1 << 30) if b <= e)
    buckets.setdefault((kind, edge), []).append((served_step(prof, predict(s, m, prof), b) / d - 1, d))
for (kind, edge), v in sorted(buckets.items()):
    e = np.array([x for x, _ in v])
    print(f"{kind:12s} rows <= {edge:>3}: {len(v):5d} steps, {sum(d for _, d in v) / total:6.1%} of the time, "
          f"median signed {np.median(e):+6.1%}, mean {np.mean(e):+6.1%}")
