"""After round 5 was seen (a diagnostic): which term misprices a prefill chunk after a cached prefix? The attention
kernel (ops.prefill) and the linear layers (ops.linear on the model's panels, at the chunk's rows) timed alone, per
model geometry, 2 threads, against the round's mixed-regime terms. Shapes: a fresh 448-token prefill, a 128-token
chunk after 448 cached tokens, a fresh 128. Median of 7; per layer x layers."""
import statistics
import time

import torch

from experiments.simulate.step_model import ModelShape, Profile, StepShape, features
from reference_engine.kernels import cpp_gemm, ops

torch.set_num_threads(2)
prof = Profile.load("results/heldout-round5/profile.json")
co = prof.regimes["mixed"]
BS = 16


def med(fn, n=7):
    fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def attention(m: ModelShape, new: int, ctx: int) -> float:
    blocks = -(-ctx // BS)
    kc = torch.randn(blocks + 1, BS, m.kv_heads, m.head_dim)
    vc = torch.randn_like(kc)
    q = torch.randn(new, m.heads, m.head_dim)
    out = torch.empty_like(q)
    tables = torch.arange(blocks, dtype=torch.int64).view(1, -1)
    lens = torch.tensor([ctx], dtype=torch.int64)
    starts = torch.tensor([0, new], dtype=torch.int64)
    return med(lambda: ops.prefill(q, kc, vc, tables, lens, starts, m.head_dim ** -0.5, out)) * m.layers


def linear(m: ModelShape, rows: int) -> float:
    mats = [((m.heads + 2 * m.kv_heads) * m.head_dim, m.hidden), (m.hidden, m.heads * m.head_dim),
            (2 * m.intermediate, m.hidden), (m.hidden, m.intermediate)]
    packed = [(n, k, cpp_gemm.pack(torch.randn(n, k) * 0.02)) for n, k in mats]
    xs = {k: torch.randn(rows, k) for _, k in mats}
    return med(lambda: [ops.linear(xs[k], p, n) for n, k, p in packed]) * m.layers


for name in ("deep", "mid", "wide", "lean"):
    m = ModelShape.from_dir(f"models/heldout-{name}")
    for label, new, ctx in (("fresh 448", 448, 448), ("128 after 448", 128, 576), ("fresh 128", 128, 128)):
        f = features(StepShape(((new, ctx, 1),)), m, prof)
        a, l = attention(m, new, ctx), linear(m, new)
        pa, pl = co["attention"] * f["attention"], co["linear_add"] * f["linear_add"]
        lm = 2 * m.layer_params * new / (prof.peak_tflops("float32") * 1e12)  # the layers' FLOPs at peak (no head)
        print(f"{name:5s} {label:14s} attention {a * 1e3:6.1f} ms (term {pa * 1e3:6.1f}: x{pa / a:.2f}; "
              f"{a / f['attention']:.2f}x roofline) | layers' linear {l * 1e3:6.1f} ms ({l / lm:.2f}x roofline)")
