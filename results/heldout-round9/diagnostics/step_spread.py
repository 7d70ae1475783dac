"""After round 9 (not its protocol): its test configs re-simulated with its own profile plus the step spread of the
fit suite's served run (--step-spread), and the closed loop's TTFTs listed, measured and simulated.
Run from the repository root: PYTHONPATH=. .venv/bin/python results/heldout-round9/diagnostics/step_spread.py"""
import json
import subprocess
import sys
from pathlib import Path

from experiments.report.predicted import capacity_interval
from experiments.simulate import bench, served_overhead, validate
from experiments.simulate.step_model import ModelShape, Profile

R, OUT = Path("results/heldout-round9"), Path("/tmp/heldout9-spread")
p = Profile.load(R / "profile.json")
sig = served_overhead.fit_spread(str(R / "steps/heldout9_fit_served.jsonl"), ModelShape.from_dir("models/heldout-tiny"), p)
print(f"fit suite's served steps (tiny): spread {sig:.3f}")
for n in ("heldout9_test_closed", "heldout9_test_poisson"):  # diagnostic only: the test model's own
    print(f"{n}'s served steps (elm): spread "
          f"{served_overhead.fit_spread(str(R / 'steps' / f'{n}.jsonl'), ModelShape.from_dir('models/heldout-elm'), p):.3f}")
p.served["step_spread"] = sig
OUT.mkdir(exist_ok=True)
p.save(OUT / "profile.json")
cfgs = {"heldout9_test_closed": "experiments/simulate/heldout/round9/test/closed.toml",
        "heldout9_test_poisson": str(R / "heldout9_test_poisson.toml"),
        "heldout9_test_search": "experiments/simulate/heldout/round9/test/search.toml"}
for c in cfgs.values():
    subprocess.run([sys.executable, "-m", "experiments.cli", "simulate", c, "--profile", str(OUT / "profile.json"),
                    "--out", str(OUT)], check=True, capture_output=True)
for n in ("heldout9_test_closed", "heldout9_test_poisson"):
    for base, tag in ((R / "predicted", "as predicted"), (OUT, "with the spread")):
        for lv, row in validate.errors_with_intervals(R / "measured" / n, base / f"{n}-simulated").items():
            print(n, lv, tag, {k: f"{row[k]['error']:+.1%}" for k in ("ttft_p50", "tpot_p50", "throughput")})
m = bench.search_of(R / "measured/heldout9_test_search", bench.subject())
s = bench.search_of(OUT / "heldout9_test_search-simulated", bench.subject() + "-simulated")
c = capacity_interval(m, s)
print("capacity with the spread:", c["measured"], c["predicted"], f"{c['error']:+.1%}", c.get("interval"))
for run, tag in ((R / "measured/heldout9_test_closed/reference", "measured"),
                 (R / "predicted/heldout9_test_closed-simulated/reference-simulated", "as predicted"),
                 (OUT / "heldout9_test_closed-simulated/reference-simulated", "with the spread")):
    rows = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    t = sorted(round(r["events"][0][0] / 1e6 - (r["sent_ns"] or r["send_ns"]) / 1e6) for r in rows
               if r["level"] == "concurrency=3")
    print(f"closed 3 streams TTFT ms, {tag}: {len(t)} requests, {len(set(t))} values:", t)
