"""fp32 linear-layer time per row count: oneDNN's prepacked linear (what PackedLinear runs) against
MKL's F.linear on the weight as stored, over all 121 SmolLM2 products of a step (30 layers x 4 + the
LM head) with distinct weights, so nothing stays in cache; 2 threads, best of 3 x 3 passes.

    .venv/bin/python scripts/gemm_rows.py [M ...]      e.g. 1 8 64 512
"""
import sys, time
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from reference_engine.model.packed_linear import PackedLinear
torch.set_num_threads(2)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
pls = [PackedLinear(torch.nn.Linear(k, n, bias=False), large="onednn") for n, k in shapes]
Ms = [int(a) for a in sys.argv[1:]] or [16, 32, 64, 128, 256]
def run(f, M):
    xs = {k: torch.randn(M, k) for k in (576, 1536)}
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        for i, (n, k) in enumerate(shapes): f(i, xs[k])
        best = min(best, time.perf_counter() - t)
    return best * 1e3
for M in Ms:
    a = b = 1e9
    for _ in range(3):
        a = min(a, run(lambda i, x: torch.ops.mkldnn._linear_pointwise(x, pls[i].packed, None, "none", [], ""), M))
        b = min(b, run(lambda i, x: torch.nn.functional.linear(x, pls[i].weight), M))
    fl = 2 * M * sum(n * k for n, k in shapes) / 1e9
    print(f"M={M}: onednn {a:.1f} ms ({fl/a*1e3:.0f} GFLOP/s)  mkl {b:.1f} ms ({fl/b*1e3:.0f} GFLOP/s)", flush=True)
