# After round 4 was seen (a diagnostic, not a result): the Poisson levels simulated again with every step
# coefficient of the round's profile scaled by 1.00 / 0.97 / 0.95 (steps 0 / 3 / 5 % faster): how far a step bias
# moves p50 TTFT and TPOT at 35 / 60 / 85 % load. Output: sensitivity.out.
set -e
mkdir -p /tmp/sens
for f in 1.00 0.97 0.95; do
  python3 -c "
import json, sys
p = json.load(open('results/heldout-round4/profile.json'))
for r in p['regimes'].values():
    for k in r: r[k] *= $f
json.dump(p, open('/tmp/sens/profile-$f.json', 'w'))"
  PYTHONPATH=. python -m experiments.cli simulate results/heldout-round4/heldout4_test_poisson.toml \
      --profile /tmp/sens/profile-$f.json --out /tmp/sens/out-$f > /dev/null 2>&1
done
python3 - <<'PY'
import json
for f in ["1.00", "0.97", "0.95"]:
    s = json.load(open(f"/tmp/sens/out-{f}/heldout4_test_poisson-simulated/reference-simulated/summary.json"))["levels"]
    print(f"steps x{f}: (p50 TTFT ms, p50 TPOT ms, output tok/s)", {lv: (round(v["ttft_ms"]["median"]), round(v["tpot_ms"]["median"], 1), round(v["output_throughput"], 1)) for lv, v in s.items()})
m = json.load(open("results/heldout-round4/measured/heldout4_test_poisson/reference/summary.json"))["levels"]
print("measured:", {lv: (round(v["ttft_ms"]["median"]), round(v["tpot_ms"]["median"], 1), round(v["output_throughput"], 1)) for lv, v in m.items()})
PY
