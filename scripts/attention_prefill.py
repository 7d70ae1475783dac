"""The C++ causal prefill attention alone (csrc/attention_prefill.cpp) on SmolLM2's attention shape: one
sequence of L tokens, 9 query heads over 3 kv heads, head dim 64, 16-token blocks; best of 200 calls.

    .venv/bin/python scripts/attention_prefill.py THREADS L {fp32|bf16} [B]

B sequences of L tokens each (default 1), prefilled in one call as one step's chunks.

Prints the time and the useful causal GFLOP/s (QK^T and PV over the keys each row sees).
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_engine.kernels import cpu_build  # noqa: E402

threads, L, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
B = int(sys.argv[4]) if len(sys.argv) > 4 else 1
H, Hkv, D, bs = 9, 3, 64, 16
dt = torch.bfloat16 if kind == "bf16" else torch.float32
torch.set_num_threads(threads)
m = cpu_build.module()
nb = (L + bs - 1) // bs
kc, vc = torch.randn(B * nb, bs, Hkv, D).to(dt), torch.randn(B * nb, bs, Hkv, D).to(dt)
q = torch.randn(B * L, H, D).to(dt)
out = torch.empty_like(q)
tables, lens = torch.arange(B * nb).view(B, nb), torch.full((B,), L)
starts = torch.arange(B + 1) * L
ts = []
for _ in range(200):
    t = time.perf_counter()
    m.prefill(q, kc, vc, tables, lens, starts, D ** -0.5, out)
    ts.append(time.perf_counter() - t)
flops = B * H * L * (L + 1) / 2 * D * 4
print(f"threads {threads}, {B} x {L} tokens, {kind}: {min(ts) * 1e6:.0f} us, {flops / min(ts) / 1e9:.1f} GFLOP/s (causal, useful)")
