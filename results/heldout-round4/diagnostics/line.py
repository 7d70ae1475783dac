"""The one-row steps of onerow.out on a line t = (c) + a * GB + b * layers, fitted on subsets of the models past the cache."""
import json
from collections import defaultdict

import numpy as np

rows = [json.loads(l) for l in open("results/heldout-round4/diagnostics/onerow.out")]
L = {"heldout-tiny": 4, "heldout-small": 12, "heldout-deep": 48, "heldout-wide": 16, "heldout-broad": 10,
     "heldout-mid": 16, "diag-narrow30": 30}
t = defaultdict(list)
for r in rows:
    t[r["name"]].append(r["measured_ms"])
GB = {r["name"]: r["GB"] for r in rows}
past = [n for n in t if n != "heldout-tiny"]
for sel in [past, ["heldout-deep", "heldout-wide", "heldout-mid"], ["heldout-deep", "heldout-wide", "diag-narrow30"]]:
    for const in (True, False):
        A = np.array([[1] * const + [GB[n], L[n]] for n in sel])
        b = np.array([np.mean(t[n]) for n in sel])
        x, *_ = np.linalg.lstsq(A / b[:, None], np.ones(len(b)), rcond=None)
        print("fitted on", ", ".join(sel), "| constant" if const else "| no constant", "| coefficients (ms, ms/GB, ms/layer)",
              np.round(x, 4), "| error per model:",
              {n: f"{(np.array([1] * const + [GB[n], L[n]]) @ x / np.mean(t[n]) - 1) * 100:+.1f} %" for n in t})
