"""The bf16 prefill attention on AMX tiles (csrc/attention_amx.cpp) against the fp32-sum kernel
(csrc/attention_prefill.cpp) on the same inputs: B prompts of L tokens from scratch, the small model's heads
(12 over 4, D = 64), 16-token blocks; best-effort mean of 200 calls each, alternating twice
(docs/perf/2026-12-05-bf16-prefill.md).

    .venv/bin/python scripts/attention_amx_ab.py THREADS [B=16] [L=128]
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_engine.kernels import cpp_gemm, cpu_build  # noqa: E402

assert cpp_gemm.amx(), "no AMX here (or INFERLAB_AMX=0): nothing to compare"
threads, B, L = int(sys.argv[1]), *(int(a) for a in (sys.argv[2:] + ["16", "128"][len(sys.argv) - 2:])[:2])
torch.set_num_threads(threads)
m = cpu_build.module()
g = torch.Generator().manual_seed(0)
H, Hkv, D, bs = 12, 4, 64, 16
blocks = B * -(-L // bs)
kc, vc = (torch.randn(blocks, bs, Hkv, D, generator=g).bfloat16() for _ in range(2))
tables = torch.arange(blocks).view(B, -1)
lens, starts = torch.full((B,), L), torch.arange(B + 1) * L
q = torch.randn(B * L, H, D, generator=g).bfloat16()
out = torch.empty_like(q)
for f in (m.prefill_amx, m.prefill) * 2:
    f(q, kc, vc, tables, lens, starts, D ** -0.5, out)
    t = time.perf_counter()
    for _ in range(200):
        f(q, kc, vc, tables, lens, starts, D ** -0.5, out)
    print(f"{f.__name__:12s} {B} x {L}, {threads} thread(s): {(time.perf_counter() - t) / 200 * 1e3:.3f} ms")
