"""After round 5 was seen (a diagnostic): the round's own calibration sweep against its profile, by model and by rows
of an all-decode step (`mixed`: steps with a prefill chunk; `sh`: all-decode steps that share KV); and each fit model's
one-row decode steps at contexts 512-1024 in the sweep (ms, median), to set beside the drift control's measurement."""
import numpy as np
from collections import defaultdict
from experiments.simulate.step_model import Profile, ModelShape, predict, regime
from experiments.simulate.sweep import load_rows

rd = "results/heldout-round5"
prof = Profile.load(f"{rd}/profile.json")
rows = load_rows(f"{rd}/profile.steps.json")
sig = {}
for n in ["tiny", "deep", "wide", "mid"]:
    m = ModelShape.from_dir(f"models/heldout-{n}")
    sig[m.signature] = (n, m)
names, ms = [], []
for s_, k in prof.fit["rows_per_model"]:
    names += [sig[s_][0]] * k
    ms += [sig[s_][1]] * k
res, one = defaultdict(list), defaultdict(list)
for (s, t), m, n in zip(rows, ms, names):
    r = regime(s, prof.fused_max_rows)
    b = len(s.seqs)
    key = "mixed" if r != "decode" else (f"sh{min(b, 33)}" if s.shared else min(b, 9))
    res[(n, key)].append(predict(s, m, prof) / t - 1)
    if b == 1 and s.seqs[0][0] == 1 and 512 <= s.seqs[0][1] <= 1024:
        one[n].append((t, predict(s, m, prof)))
for n in ["tiny", "deep", "wide", "mid"]:
    print(n, " ".join(f"{k[1]}:{np.median(v) * 100:+.1f}({len(v)})"
                      for k, v in sorted(res.items(), key=lambda kv: str(kv[0][1])) if k[0] == n))
for n, v in one.items():
    t, p = np.array(v).T
    print(f"{n}: one-row decode at context 512-1024 in the sweep: {len(v)} steps, measured {np.median(t) * 1e3:.2f} ms, "
          f"predicted {np.median(p) * 1e3:.2f} ms")
