"""Step times of the reference engine in process: the fastest prefill chunk (2048 tokens) and the
fastest and median decode step at batch B. Minimums, because a shared 2-core machine only ever
slows a step down; compare settings A/B in alternation within one session.

    .venv/bin/python scripts/bench_steps.py MODEL_DIR B PROMPT_LEN STEPS [key=value EngineConfig overrides]
    e.g. OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_steps.py models/tiny-llama 64 128 24 num_threads=1 fused_ops=false
"""
import random, sys, time
from reference_engine import LLM, SamplingParams
model, b, p, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
kw = {k: ({"true": True, "false": False}.get(v, int(v) if v.isdigit() else v)) for k, v in (x.split("=") for x in sys.argv[5:])}
dtype = kw.pop("dtype", "float32")
llm = LLM(model, dtype=dtype, kv_cache_tokens=b * (p + steps + 80), max_num_seqs=b, max_num_batched_tokens=max(2048, b), **kw)
e = llm.engine
rng = random.Random(0); V = e.model_config.vocab_size
for _ in range(b):
    e.add_request([rng.randrange(3, V) for _ in range(p)], SamplingParams(max_tokens=steps + 64, temperature=0.0, ignore_eos=True))
pre = []
while any(r.num_computed_tokens < p for r in e.scheduler.running) or e.scheduler.waiting:
    t = time.perf_counter(); e.step(); pre.append(time.perf_counter() - t)
for _ in range(2): e.step()
dec = []
for _ in range(steps):
    t = time.perf_counter(); e.step(); dec.append(time.perf_counter() - t)
full = [x for x in pre[:-1]] or pre
print(f"{model.split('/')[-1]} {dtype} b={b} {kw}: prefill chunk min {min(full)*1e3:.1f} ms ({2048/min(full):,.0f} tok/s), decode step min {min(dec)*1e3:.2f} ms ({b/min(dec):,.0f} tok/s), median {sorted(dec)[len(dec)//2]*1e3:.2f}")
