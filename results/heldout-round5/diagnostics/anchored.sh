# After round 5 was seen (a diagnostic, not a result): what a speed anchor would have predicted. The drift control
# (mid's one-row decode at 768-token prompts, 06:26:29, just before the test phases) measured 50.53 ms against the
# profile's 56.69 ms. "mem": the memory-bound terms (weights, cached, kv, kv_shared) of every regime scaled so that the
# control's step comes out as measured, the compute terms kept; "all": every coefficient scaled by 50.53 / 56.69.
# The Poisson and closed configs simulated again with each. Output: anchored.out.
set -e
PY=${PY:-.venv/bin/python}
mkdir -p /tmp/anch
PYTHONPATH=. $PY - <<'PY'
import json
from experiments.simulate.step_model import ModelShape, Profile, StepShape, features, coefficient
p = Profile.load("results/heldout-round5/profile.json")
m = ModelShape.from_dir("models/heldout-mid")
MEM = ("weights", "cached", "kv", "kv_shared")
f = features(StepShape(((1, 792, 1),)), m, p)
co = p.regimes["decode"]
mem = co["weights"] * f["weights"] + co["kv"] * f["kv"]
total = 56.69e-3
a = (50.53e-3 - (total - mem)) / mem
print(f"memory terms x{a:.3f}, all terms x{50.53 / 56.69:.3f}")
raw = json.load(open("results/heldout-round5/profile.json"))
for name, keys, s in (("mem", MEM, a), ("all", None, 50.53 / 56.69)):
    q = json.loads(json.dumps(raw))
    for r in [q["coef"], *q["regimes"].values()]:
        for k in r:
            if keys is None or k in keys:
                r[k] *= s
    json.dump(q, open(f"/tmp/anch/profile-{name}.json", "w"))
PY
for v in mem all; do
  for c in heldout5_test_poisson; do
    PYTHONPATH=. $PY -m experiments.cli simulate results/heldout-round5/$c.toml --profile /tmp/anch/profile-$v.json --out /tmp/anch/out-$v > /dev/null 2>&1
  done
  PYTHONPATH=. $PY -m experiments.cli simulate experiments/simulate/heldout/round5/test/closed.toml --profile /tmp/anch/profile-$v.json --out /tmp/anch/out-$v > /dev/null 2>&1
done
$PY - <<'PY'
import json
def lv(path):
    s = json.load(open(path))["levels"]
    return {k: (round(v["ttft_ms"]["median"]), round(v["tpot_ms"]["median"], 1)) for k, v in s.items()}
for c in ("heldout5_test_closed", "heldout5_test_poisson"):
    meas = lv(f"results/heldout-round5/measured/{c}/reference/summary.json")
    rows = {"as predicted": lv(f"results/heldout-round5/predicted/{c}-simulated/reference-simulated/summary.json")}
    for v in ("mem", "all"):
        rows[f"anchored ({v})"] = lv(f"/tmp/anch/out-{v}/{c}-simulated/reference-simulated/summary.json")
    print(c, "measured (p50 TTFT ms, p50 TPOT ms):", meas)
    for k, r in rows.items():
        print(f"  {k:14s}", {l: f"TTFT {r[l][0] / meas[l][0] - 1:+.1%}, TPOT {r[l][1] / meas[l][1] - 1:+.1%}" for l in meas})
PY
