"""The panel GEMM against oneDNN at prefill size (8 gate_up products 3072 x 576, 512 rows) on 1 and 2 threads,
alternating, median of 5: does each use the second thread? (docs/perf/2026-12-04-one-layout.md)

    .venv/bin/python scripts/gemm_threads.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import time, torch, statistics
from reference_engine.kernels import cpu_build, cpp_gemm  # noqa: E402
m = cpu_build.module()
ws = [torch.randn(3072, 576) * 0.05 for _ in range(8)]
pan = [cpp_gemm.pack(w) for w in ws]
dn = [torch.ops.mkldnn._reorder_linear_weight(w) for w in ws]
x = torch.randn(512, 576); e = torch.empty(0)
f = {"panel": lambda i: m.linear(x, pan[i], 3072, e), "onednn": lambda i: torch.ops.mkldnn._linear_pointwise(x, dn[i], None, "none", [], "")}
res = {}
for rep in range(5):
    for th in (1, 2):
        torch.set_num_threads(th)
        for k, fn in f.items():
            t = time.perf_counter()
            for i in range(8): fn(i)
            res.setdefault((k, th), []).append(time.perf_counter() - t)
for k, v in sorted(res.items()): print(k, f"{statistics.median(v)*1e3:.0f} ms")
