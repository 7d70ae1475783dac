"""Where a reference-engine decode step spends its CPU time, before and after the CPU fast path.

Builds the engine twice on one model, once with the PyTorch reference path
(attention_backend="torch", linear_backend="torch") and once with the CPU defaults (oneDNN
linear layers, C++ decode attention), profiles the prefill of B sequences of P prompt
ids, then S decode steps of that batch, with torch.profiler. Prints each run's decode tok/s and its top ops
by self CPU time.

    .venv/bin/python scripts/profile_cpu.py [MODEL_DIR] [B] [P] [S]
"""
from __future__ import annotations

import random
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from reference_engine import LLM, SamplingParams


def run(model: str, b: int, p: int, steps: int, **kw) -> None:
    llm = LLM(model, dtype="float32", kv_cache_tokens=b * (p + steps + 16), max_num_seqs=b,
              max_num_batched_tokens=max(2048, b), **kw)
    e = llm.engine
    rng = random.Random(0)
    vocab = e.model_config.vocab_size
    for _ in range(b):
        e.add_request([rng.randrange(3, vocab) for _ in range(p)],
                      SamplingParams(max_tokens=steps + 64, temperature=0.0, ignore_eos=True))
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as pre:
        while any(r.num_computed_tokens < p for r in e.scheduler.running) or e.scheduler.waiting:
            e.step()  # prefill everything first (chunks of max_num_batched_tokens)
    pre_s = time.perf_counter() - t
    for _ in range(3):
        e.step()  # warm decode
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as dec:
        for _ in range(steps):
            e.step()
    dec_s = time.perf_counter() - t
    eff = e.effective_config()
    print(f"\n## attention_backend={eff['attention_backend']} linear_backend={eff['linear_backend']} "
          f"threads={torch.get_num_threads()}\n")
    print(f"prefill: {b} x {p} tokens in {pre_s:.2f} s, {b * p / pre_s:,.0f} tok/s (under the profiler)")
    print(pre.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    print(f"decode: batch {b}, {steps} steps in {dec_s:.2f} s, {b * steps / dec_s:,.0f} tok/s (under the profiler)")
    print(dec.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    model = sys.argv[1] if len(sys.argv) > 1 else "models/small-llama"
    b, p, s = (int(x) for x in (sys.argv[2:5] + ["64", "128", "16"][len(sys.argv[2:5]):]))
    run(model, b, p, s, attention_backend="torch", linear_backend="torch")
    run(model, b, p, s)
