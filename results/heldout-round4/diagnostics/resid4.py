import json, numpy as np
from collections import defaultdict
from experiments.simulate.step_model import Profile, StepShape, ModelShape, predict, regime
rd='results/heldout-round4'
prof=Profile.load(f'{rd}/profile.json'); steps=json.load(open(f'{rd}/profile.steps.json'))
sig={}
for n in ['tiny','deep','wide','mid']:
    m=ModelShape.from_dir(f'models/heldout-{n}'); sig[m.signature]=(n,m)
names=[];ms=[]
for s_,k in prof.fit['rows_per_model']: names+=[sig[s_][0]]*k; ms+=[sig[s_][1]]*k
res=defaultdict(list); ctx=defaultdict(list)
for (a,t),m,n in zip(steps,ms,names):
    s=StepShape(tuple(tuple(x) for x in a)); r=regime(s,prof.fused_max_rows)
    k=(n,'mixed' if r!='decode' else min(len(s.seqs),9)); res[k].append(predict(s,m,prof)/t-1)
for n in ['tiny','deep','wide','mid']:
    print(n, ' '.join(f"{k[1]}:{np.median(v)*100:+.1f}({len(v)})" for k,v in sorted(res.items(), key=lambda kv: str(kv[0][1])) if k[0]==n))
