"""After round 5 was seen (a diagnostic): requests in flight at each Poisson level, measured against simulated
(Little's law from the request records: the sum of each request's send-to-done time over the level's span), with
the mean end-to-end latency and the mean time between a request's tokens."""
import json
from collections import defaultdict

import numpy as np

RUNS = {"measured": "results/heldout-round5/measured/heldout5_test_poisson/reference/requests.jsonl",
        "predicted": "results/heldout-round5/predicted/heldout5_test_poisson-simulated/reference-simulated/requests.jsonl"}
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
