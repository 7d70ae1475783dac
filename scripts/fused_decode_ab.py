"""The CPU decode fast path (reference_engine/fused_decode.py) against the module path, in one process:
SmolLM2 decode steps at batch B after P-token prompts, the two alternating step by step.

    .venv/bin/python scripts/fused_decode_ab.py B P STEPS        e.g. 1 128 80
"""
import random
import statistics as st
import sys
import time

from reference_engine import LLM, SamplingParams

b, p, steps = (int(a) for a in sys.argv[1:4])
e = LLM("models/smollm2-135m-instruct", dtype="float32", kv_cache_tokens=b * (p + steps + 80), max_num_seqs=b,
        num_threads=2).engine
rng = random.Random(0)
for _ in range(b):
    e.add_request([rng.randrange(3, 49152) for _ in range(p)],
                  SamplingParams(max_tokens=steps + 64, temperature=0.0, ignore_eos=True))
while any(r.num_computed_tokens < p for r in e.scheduler.running) or e.scheduler.waiting:
    e.step()
fast = e.runner.fast_decode
times: dict[str, list[float]] = {"modules": [], "fused": []}
for i in range(steps + 4):
    kind = "fused" if i % 2 else "modules"
    e.runner.fast_decode = fast if kind == "fused" else None
    t = time.perf_counter()
    e.step()
    if i >= 4:
        times[kind].append(time.perf_counter() - t)
for kind, v in times.items():
    print(f"b={b} {kind}: min {min(v) * 1e3:.2f}  p25 {st.quantiles(v, n=4)[0] * 1e3:.2f}  median {st.median(v) * 1e3:.2f} ms")
