"""The C++ paged decode attention over 30 layers of SmolLM2's KV shape, every layer's cache cold (distinct
tensors, 218 MB) and warm (one layer's cache reused), beside a plain read of the same bytes (Tensor.sum):
docs/perf/2026-12-05-prefill-gemm.md, "The decode attention waits on memory".

    .venv/bin/python scripts/attention_cold.py THREADS [--heads-contiguous]

Default: 64 sequences x 72 tokens, 9 query / 3 kv heads, block 16 (the cache's (block, token, kv head, dim)
layout: a head's rows 256 bytes every 768). --heads-contiguous: the same bytes and FLOPs as 192 sequences of
3 query / 1 kv head, so each head's rows of a block are contiguous (what a head-major layout would read).
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_engine.kernels import cpu_build  # noqa: E402

torch.set_num_threads(int(sys.argv[1]))
nat = cpu_build.module()
B, H, Hkv = (192, 3, 1) if "--heads-contiguous" in sys.argv else (64, 9, 3)
D, bs, ctx, L = 64, 16, 72, 30
per = (ctx + bs - 1) // bs
nblk = B * per + 8
caches = [(torch.randn(nblk, bs, Hkv, D), torch.randn(nblk, bs, Hkv, D)) for _ in range(L)]
tables = torch.randperm(nblk)[: B * per].view(B, per).contiguous()
lens = torch.full((B,), ctx, dtype=torch.long)
q = torch.randn(B, H, D)
out = torch.empty_like(q)
for warm in (False, True):
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        for layer in range(L):
            k, v = caches[0 if warm else layer]
            nat.decode(q, k, v, tables, lens, 0.125, out)
        ts.append(time.perf_counter() - t)
    print(f"{'warm' if warm else 'cold'}: {min(ts) * 1e3:.2f} ms per step ({L} layers)")
ts = []
for _ in range(5):
    t = time.perf_counter()
    for k, v in caches:
        k.sum(), v.sum()
    ts.append(time.perf_counter() - t)
gb = sum(k.numel() * 8 for k, _ in caches) / 1e9
print(f"Tensor.sum of every cache: {min(ts) * 1e3:.2f} ms, {gb / min(ts):.1f} GB/s")
