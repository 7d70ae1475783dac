"""Time per module kind (linear, attention, fused element-wise) of one SmolLM2 prefill step of B prompts
x P tokens and of 8 decode steps, through forward hooks (the C++ kernels are invisible to torch.profiler).

    .venv/bin/python scripts/stage_times.py B P      e.g. 64 64
"""
import os; os.environ.setdefault("INFERLAB_FUSED_DECODE", "0")  # hooks do not fire on the fused decode path
import random, sys, time, collections, torch
from reference_engine import LLM, SamplingParams
b, p = int(sys.argv[1]), int(sys.argv[2])
llm = LLM("models/smollm2-135m-instruct", dtype="float32", kv_cache_tokens=16384, max_num_seqs=128, max_num_batched_tokens=max(2048,b), num_threads=2)
e = llm.engine
acc = collections.defaultdict(float); cnt = collections.Counter()
stack = {}
def pre(m, inp): stack[id(m)] = time.perf_counter()
def post(m, inp, out):
    acc[type(m).__name__] += time.perf_counter() - stack.pop(id(m)); cnt[type(m).__name__] += 1
model = e.runner.model
for m in model.modules():
    if type(m).__name__ in ("PackedLinear","FusedRMSNorm","FusedRotary","FusedSiluAndMul","Embedding","Linear"):
        m.register_forward_pre_hook(pre); m.register_forward_hook(post)
be = e.runner.attn if hasattr(e.runner,'attn') else None
for name in ("attn_backend","backend","attention"):
    if hasattr(e.runner, name): be = getattr(e.runner, name); break
orig = be.forward
def fwd(*a, **k):
    t = time.perf_counter(); r = orig(*a, **k); acc["attention"] += time.perf_counter() - t; cnt["attention"] += 1; return r
be.forward = fwd
rng = random.Random(0)
def add(n, maxt):
    for _ in range(n):
        e.add_request([rng.randrange(3, 49152) for _ in range(p)], SamplingParams(max_tokens=maxt, temperature=0.0, ignore_eos=True))
add(b, 1); e.step()
while e.scheduler.running or e.scheduler.waiting: e.step()
for mode in ("prefill", "decode"):
    acc.clear(); cnt.clear()
    if mode == "prefill":
        add(b, 12); t = time.perf_counter(); e.step(); tot = time.perf_counter() - t
    else:
        e.step(); acc.clear(); cnt.clear()
        t = time.perf_counter()
        for _ in range(8): e.step()
        tot = (time.perf_counter() - t)
    print(f"{mode} b={b} p={p}: step total {tot*1e3:.1f} ms")
    for k, v in sorted(acc.items(), key=lambda x: -x[1]):
        print(f"   {k:18s} {v*1e3:9.1f} ms {100*v/tot:5.1f}% ({cnt[k]} calls)")
    print(f"   {'(rest)':18s} {(tot-sum(acc.values()))*1e3:9.1f} ms {100*(tot-sum(acc.values()))/tot:5.1f}%")
