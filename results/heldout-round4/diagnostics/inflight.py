"""After round 4 was seen (a diagnostic; `python inflight.py 5` for round 5, after it was seen): requests in flight at each Poisson level, measured against simulated
(Little's law from the request records: the sum of each request's send-to-done time over the level's span), with
the mean end-to-end latency and the mean time between a request's tokens."""
import json
import sys
from collections import defaultdict

import numpy as np

R = int(sys.argv[1]) if len(sys.argv) > 1 else 4  # the round
RUNS = {"measured": f"results/heldout-round{R}/measured/heldout{R}_test_poisson/reference/requests.jsonl",
        "predicted": f"results/heldout-round{R}/predicted/heldout{R}_test_poisson-simulated/reference-simulated/requests.jsonl"}
for what, path in RUNS.items():
    lv = defaultdict(lambda: defaultdict(list))
    for line in open(path):
        r = json.loads(line)
        if r.get("done_ns") and r.get("events"):
            lv[r["level"]][r["repeat"]].append(r)
    for level, reps in lv.items():
        infl, e2e, gap = [], [], []
        for rs in reps.values():
            span = max(r["done_ns"] for r in rs) - min(r["send_ns"] for r in rs)
            infl.append(sum(r["done_ns"] - r["send_ns"] for r in rs) / span)
            e2e += [(r["done_ns"] - r["send_ns"]) / 1e9 for r in rs]
            gap += [(r["events"][-1][0] - r["events"][0][0]) / 1e6 / max(1, len(r["events"]) - 1) for r in rs]
        print(f"{what:9s} {level:9s} in flight {np.mean(infl):5.1f} (per process {', '.join(f'{x:.1f}' for x in infl)}), "
              f"mean E2E {np.mean(e2e):5.2f} s, mean token gap {np.mean(gap):6.1f} ms")
