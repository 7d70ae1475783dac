"""Where one decode step of the reference engine goes, in process: torch.profiler (ops, self CPU time)
and cProfile (Python functions, own time), over S decode steps of B sequences of P prompt ids.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/profile_decode.py MODEL_DIR B [P] [S] [key=value EngineConfig overrides]
    e.g. ... scripts/profile_decode.py models/smollm2-135m-instruct 4 128 16 num_threads=1

Prints the step time (min and median, unprofiled, before the profilers run), then both tables.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import random
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from reference_engine import LLM, SamplingParams


def overrides(args: list[str]) -> dict:
    conv = {"true": True, "false": False}
    return {k: conv.get(v, int(v) if v.isdigit() else v) for k, v in (a.split("=", 1) for a in args)}


def main(model: str, b: int, p: int, steps: int, **kw) -> None:
    e = LLM(model, dtype=kw.pop("dtype", "float32"), kv_cache_tokens=b * (p + 4 * steps + 64), max_num_seqs=b,
            max_num_batched_tokens=max(2048, b), **kw).engine
    rng, params = random.Random(0), SamplingParams(max_tokens=4 * steps + 32, temperature=0.0, ignore_eos=True)
    prompts = [[rng.randrange(3, e.model_config.vocab_size) for _ in range(p)] for _ in range(b)]
    for ids in prompts:
        e.add_request(ids, params)
    while any(r.num_computed_tokens < p for r in e.scheduler.running) or e.scheduler.waiting:
        e.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        e.step()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    print(f"\n## decode, batch {b}, context ~{p}: step min {times[0]:.2f} ms, median {times[len(times) // 2]:.2f} ms "
          f"(torch threads {torch.get_num_threads()}, {e.effective_config()['linear_backend']} linears, "
          f"{e.effective_config()['attention_backend']} attention, fused_ops {e.effective_config()['fused_ops']})")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            e.step()
    print(f"\n### torch.profiler, {steps} steps, top ops by self CPU time\n")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        e.step()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(16)
    print(f"\n### cProfile, {steps} steps, top functions by own time\n")
    print("\n".join(buf.getvalue().splitlines()[4:]))


if __name__ == "__main__":
    a = sys.argv[1:]
    model, b = a[0], int(a[1])
    nums = [x for x in a[2:4] if "=" not in x]
    p, s = (int(x) for x in nums + ["128", "16"][len(nums):])
    main(model, b, p, s, **overrides([x for x in a[2:] if "=" in x]))
