import json, numpy as np
from collections import defaultdict
from experiments.simulate import calibrate as C
from experiments.simulate.step_model import Profile, StepShape, ModelShape, predict, regime
rd='results/heldout-round3'
prof=Profile.load(f'{rd}/profile.json'); steps=json.load(open(f'{rd}/profile.steps.json'))
sig={}
for n in ['tiny','deep','wide','mid','broad']:
    m=ModelShape.from_dir(f'models/heldout-{n}'); sig[m.signature]=(n,m)
names=[]
for s_,k in prof.fit['rows_per_model']: names+=[sig[s_][0]]*k
rows=[(StepShape(tuple(tuple(x) for x in a)),t) for a,t in steps]
ms=[[v for v in sig.values() if v[0]==n][0][1] for n in names]
p=C.calibrate(rows, ms, prof.bandwidth_gbps, list(prof.tflops.values())[0], 'reference', fused_max_rows=prof.fused_max_rows, cache_bytes=C.resident_bytes())
print(json.dumps(p.regimes)); print(p.tile_rows, p.fit['sweep'])
res=defaultdict(list)
for (s,t),m,n in zip(rows,ms,names):
    r=regime(s,p.fused_max_rows); res[(n,'mixed' if r!='decode' else min(len(s.seqs),9))].append(predict(s,m,p)/t-1)
for n in ['tiny','deep','wide']:
    print(n, ' '.join(f"{k[1]}:{np.median(v)*100:+.1f}" for k,v in sorted(res.items(), key=lambda kv: str(kv[0][1])) if k[0]==n))
