"""The bf16 panel GEMM on AMX against the same panels on vdpbf16ps (or the widening FMAs), at decode and
prefill row counts: all 121 products of a SmolLM2-135M step (distinct random weights, so nothing stays in
cache), best of 5 passes per path, alternating (csrc/linear_amx.cpp; docs/perf/2026-12-05-amx.md).

    .venv/bin/python scripts/amx_ab.py ROWS [ROWS ...]
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_engine.kernels import cpp_gemm  # noqa: E402

torch.set_num_threads(2)
assert cpp_gemm.amx(), "no AMX here (or INFERLAB_AMX=0): nothing to compare"
other = "vdpbf16ps" if cpp_gemm.bf16_native() else "fma"
g = torch.Generator().manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
panels = [cpp_gemm.pack(torch.randn(n, k, generator=g).to(torch.bfloat16)) for n, k in shapes]
for m in map(int, sys.argv[1:]):
    xs = {k: torch.randn(m, k, generator=g).to(torch.bfloat16) for k in (576, 1536)}
    best = {}
    for _ in range(5):
        for path in ("amx", other):
            t = time.perf_counter()
            for (n, k), p in zip(shapes, panels):
                cpp_gemm.gemm_bf16(xs[k], p, n, None, path)
            best[path] = min(best.get(path, float("inf")), time.perf_counter() - t)
    print(f"{m} rows: amx {best['amx'] * 1e3:.2f} ms, {other} {best[other] * 1e3:.2f} ms, "
          f"ratio {best['amx'] / best[other]:.3f}", flush=True)
