"""The panel GEMM against oneDNN's packed linear, per product: SmolLM2-135M's shapes at one row count, each
with its own minimum (what docs/perf/2026-12-05-prefill-gemm.md's per-shape tables quote).

    .venv/bin/python scripts/gemm_shapes.py THREADS ROWS [--pass] [--bf16] [--small]

Without --pass: one product per shape (the same x and W each time, 5 tries, best of each side, alternating).
With --pass: the whole model's 121 products with distinct weights (nothing stays in cache), 4 passes
alternating, the best per shape summed per product kind; prints each kind's ratio and the total.
--bf16: bf16 x and W (the pair panels against oneDNN's bf16 copy). --small: the `small` preset's shapes
(hidden 768, 12 layers, kv heads 4, intermediate 2,048) instead of SmolLM2-135M's.
"""
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_engine.kernels import cpp_gemm, cpu_build  # noqa: E402

threads, M, whole = int(sys.argv[1]), int(sys.argv[2]), "--pass" in sys.argv
DT = torch.bfloat16 if "--bf16" in sys.argv else torch.float32
SMALL = "--small" in sys.argv
torch.set_num_threads(threads)
nat, empty = cpu_build.module(), torch.empty(0)


def onednn(x, od):
    return torch.ops.mkldnn._linear_pointwise(x, od, None, "none", [], "")


if not whole:
    kn = [(768, 1280), (768, 768), (768, 4096), (2048, 768)] if SMALL else \
        [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)]
    for K, N in kn:
        w, x = (torch.randn(N, K) * 0.05).to(DT), torch.randn(M, K).to(DT)
        pk, od = cpp_gemm.pack(w), torch.ops.mkldnn._reorder_linear_weight(w)
        ta, tb = [], []
        for _ in range(5 if N < 10000 else 2):
            t = time.perf_counter(); onednn(x, od); ta.append(time.perf_counter() - t)
            t = time.perf_counter(); nat.linear(x, pk, N, empty); tb.append(time.perf_counter() - t)
        f = 2 * M * K * N / 1e9
        print(f"{M} x {K} -> {N}: oneDNN {f / min(ta):.1f} GFLOP/s, panels {f / min(tb):.1f}, "
              f"time ratio {min(tb) / min(ta):.3f}", flush=True)
    sys.exit(0)

shapes = [(1280, 768), (768, 768), (4096, 768), (768, 2048)] * 12 if SMALL else \
    [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
g = torch.Generator().manual_seed(0)
ws = [(torch.randn(n, k, generator=g) * 0.05).to(DT) for n, k in shapes]
pk = [cpp_gemm.pack(w) for w in ws]
od = [torch.ops.mkldnn._reorder_linear_weight(w) for w in ws]
xs = {k: torch.randn(M, k, generator=g).to(DT) for k in sorted({k for _, k in shapes})}
A, B = collections.defaultdict(list), collections.defaultdict(list)
for _ in range(4):
    for side, acc in (("a", A), ("b", B)):
        tot = collections.Counter()
        for i, (n, k) in enumerate(shapes):
            t = time.perf_counter()
            onednn(xs[k], od[i]) if side == "a" else nat.linear(xs[k], pk[i], n, empty)
            tot[(n, k)] += time.perf_counter() - t
        for s, v in tot.items():
            acc[s].append(v)
for s in A:
    a, b = min(A[s]) * 1e3, min(B[s]) * 1e3
    print(f"N={s[0]} K={s[1]}: oneDNN {a:.1f} ms, panels {b:.1f} ms, ratio {b / a:.3f}")
print(f"total ratio {sum(min(v) for v in B.values()) / sum(min(v) for v in A.values()):.3f}")
