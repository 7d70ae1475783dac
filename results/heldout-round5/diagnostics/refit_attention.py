"""After round 5 was seen (a diagnostic): round 5's own sweep refitted with the mixed regime's attention held at the
kernel's measured ratio (kernels.out: 2.0-2.6x its roofline on every geometry) instead of fitted (4.7x): the sweep's
error, the side-by-side prefill steps of prefill.out, and the held-out trace's steps with a prefill chunk."""
import json, numpy as np, statistics
from experiments.simulate import calibrate
from experiments.simulate.step_model import Profile, ModelShape, StepShape, predict, regime, features
from experiments.simulate.sweep import load_rows
rd="results/heldout-round5"
prof=Profile.load(f"{rd}/profile.json"); rows=load_rows(f"{rd}/profile.steps.json")
sig={}
for n in ["tiny","deep","wide","mid"]:
    m=ModelShape.from_dir(f"models/heldout-{n}"); sig[m.signature]=(n,m)
ms=[]; 
for s_,k in prof.fit["rows_per_model"]: ms+=[sig[s_][1]]*k
lean=ModelShape.from_dir("models/heldout-lean")
meas={("deep",448,448):949.9,("deep",128,576):350.9,("deep",128,128):302.2,("mid",448,448):920.4,("mid",128,576):339.1,("mid",128,128):276.6,("lean",448,448):854.3,("lean",128,576):285.1,("lean",128,128):237.8}
def show(p,label):
    e=calibrate.errors(rows,ms,p)
    print(label, f"sweep |err| {e['median_abs']:.1%}/{e['p90_abs']:.1%}", {k: round(v,3) for k,v in p.regimes['mixed'].items() if v})
    out=[]
    for (n,new,ctx),t in meas.items():
        m=lean if n=="lean" else sig[[k for k,v in sig.items() if v[0]==n][0]][1]
        out.append(f"{n} {new}@{ctx} {predict(StepShape(((new,ctx,1),)),m,p)*1e3/t-1:+.0%}")
    print("  ", ", ".join(out))
    for c in (1,8,24):
        tr=[(s,d) for s,d in load_rows(f"{rd}/trace-c{c}.steps.json") if regime(s,p.fused_max_rows)!="decode"]
        print(f"   trace c{c} mixed {calibrate.errors(tr,lean,p)['median_signed']:+.1%}", end="")
    print()
show(prof,"as fitted")
for a in (2.0,2.3,2.6):
    p=calibrate.fit_regimes(rows,ms,Profile(**{**prof.__dict__,"regimes":{}}),prof.fused_max_rows,fixed={"mixed":{"attention":a}})
    show(p,f"mixed attention fixed {a}")
