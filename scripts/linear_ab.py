"""Two A/Bs of the fp32 linear kernels over one pass of SmolLM2-135M's 121 products (30 layers x
qkv, o, gate_up, down + the LM head; distinct random weights, so nothing stays in cache), alternating
A and B within one run, median of the passes; time ratios B / A (below 1: B faster).

    --layout OLD_TREE: A = the three layouts of OLD_TREE's kernels (before 2026-12-04's one layout: the
              GEMV on W as stored <= 12 rows, the GEMM on the panels 13-128, oneDNN's packed copy
              above), B = one layout: this tree's panel GEMM for every row count
    --isa:    A = the AVX-512 build, B = the AVX2 + FMA build of this tree's kernels (cpu_build.load
              with isa_), the panel GEMM at every row count
    --onednn: A = oneDNN's packed linear (torch.ops.mkldnn, what INFERLAB_LINEAR=onednn runs), B = this
              tree's panel GEMM; with --bf16 both on bf16 weights and activations (B: the bf16 pair panels)

    .venv/bin/python scripts/linear_ab.py --layout OLD_TREE | --isa | --onednn [--bf16] [--threads N]
        [--passes N] [M ...]
(docs/perf/2026-12-04-one-layout.md, 2026-12-04-one-layout-2.md).
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_engine.kernels import cpp_gemm, cpu_build  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--layout", metavar="OLD_TREE")
p.add_argument("--isa", action="store_true")
p.add_argument("--onednn", action="store_true")
p.add_argument("--bf16", action="store_true")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--passes", type=int, default=7)
p.add_argument("rows", type=int, nargs="*", default=[1, 8, 12, 16, 64, 128, 512, 2048])
a = p.parse_args()
torch.set_num_threads(a.threads)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
g = torch.Generator().manual_seed(0)
dtype = torch.bfloat16 if a.bf16 else torch.float32
ws = [(torch.randn(n, k, generator=g) * 0.05).to(dtype) for n, k in shapes]
panels = [cpp_gemm.pack(w) for w in ws]  # fp32 (P, K, 32) or bf16 (P, K/2, 32, 2)
onednn = [torch.ops.mkldnn._reorder_linear_weight(w) for w in ws] if a.layout or a.onednn else None
empty = torch.empty(0)


def routed(mod):
    def f(i, x):
        m = x.shape[0]
        if m <= 12:
            return mod.gemv(x, ws[i], empty)
        if m <= 128:
            return mod.linear(x, panels[i], shapes[i][0], empty)
        return torch.ops.mkldnn._linear_pointwise(x, onednn[i], None, "none", [], "")
    return f


def panel_gemm(mod):
    return lambda i, x: mod.linear(x, panels[i], shapes[i][0], empty)


def onednn_linear(i, x):
    return torch.ops.mkldnn._linear_pointwise(x, onednn[i], None, "none", [], "")


native = cpu_build.module()
if a.onednn:
    sides = {f"oneDNN {dtype}": onednn_linear, "panel GEMM": panel_gemm(native)}
elif a.layout:
    # another module name: Python keeps one extension module per name, the native build has "inferlab_cpu"
    old = cpu_build.load("inferlab_ab_old", cpu_build.sources(Path(a.layout) / "reference_engine/kernels/csrc"))
    sides = {"three layouts": routed(old), "one layout": panel_gemm(native)}
else:
    avx2 = cpu_build.load("inferlab_cpu", cpu_build.sources(), isa_="AVX2")
    sides = {f"{cpu_build.isa()}": panel_gemm(native), "AVX2": panel_gemm(avx2)}


def one_pass(f, xs):
    t = time.perf_counter()
    for i, (n, k) in enumerate(shapes):
        f(i, xs[k])
    return time.perf_counter() - t


(na, fa), (nb, fb) = sides.items()
print(f"| rows | {na} ms | {nb} ms | {nb} / {na} |\n|---|---|---|---|")
for m in a.rows:
    xs = {k: torch.randn(m, k, generator=g).to(dtype) for k in (576, 1536)}
    ta, tb = [], []
    for _ in range(a.passes if m <= 128 else max(3, a.passes // 2)):
        ta.append(one_pass(fa, xs))
        tb.append(one_pass(fb, xs))
    A, B = statistics.median(ta) * 1e3, statistics.median(tb) * 1e3
    print(f"| {m} | {A:.1f} | {B:.1f} | {B / A:.2f} |", flush=True)
