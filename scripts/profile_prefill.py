"""Where one prefill's time goes, op by op (torch.profiler), in-process on 2 threads:

    .venv/bin/python scripts/profile_prefill.py MODEL DTYPE PROMPTS TOKENS

PROMPTS prompts of TOKENS random tokens, prefilled together (max_tokens=1); prints the best of 15 timed calls
and the profiler's table for 5 more (INFERLAB_LINEAR=onednn for the oneDNN path).
"""
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_engine import LLM, SamplingParams  # noqa: E402

model, dtype, n, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(2)
llm = LLM(model, dtype=dtype, max_num_seqs=max(8, n), kv_cache_tokens=max(16384, 2 * n * length))
g = torch.Generator().manual_seed(0)
sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def one() -> float:
    ps = [torch.randint(100, 30000, (length,), generator=g).tolist() for _ in range(n)]
    t = time.perf_counter()
    llm.generate(ps, sp)
    return time.perf_counter() - t


for _ in range(3):
    one()
best = min(one() for _ in range(15))
print(f"{os.environ.get('INFERLAB_LINEAR', 'default')} {dtype} {n} x {length} prefill: best {best * 1e3:.1f} ms")
from torch.profiler import profile  # noqa: E402

with profile() as prof:
    for _ in range(5):
        one()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
