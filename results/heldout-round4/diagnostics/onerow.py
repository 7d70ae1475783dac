import json, time, sys
from experiments.simulate import probe
from experiments.simulate.step_model import Profile, ModelShape
prof = Profile.load('results/heldout-round3/profile.json')
names = sys.argv[1].split(',')
out = []
for rep in range(2):
    for n in names:
        d = f'models/{n}'
        m = ModelShape.from_dir(d)
        g = probe.gemm_pass(m, 2)
        r = probe.one_row(d, prof, 2)
        r.update(name=n, rep=rep, gemm_ms=g*1e3, GB=m.weight_bytes/1e9, eff_GBps=m.weight_bytes/1e9/(r['measured_ms']/1e3))
        print(json.dumps(r), flush=True)
