"""A/B of the two decode fast paths against what they replace, on SmolLM2-135M fp32:

    .venv/bin/python scripts/decode_ab.py kernel 1 4 8        # the C++ GEMV vs oneDNN, one cold pass over the 121 products
    .venv/bin/python scripts/decode_ab.py gemv B P STEPS      # engine decode steps, the GEMV vs oneDNN, alternating
    .venv/bin/python scripts/decode_ab.py layer B P STEPS     # engine decode steps, one C++ call per layer vs the modules
    .venv/bin/python scripts/decode_ab.py gemm B P STEPS      # engine decode steps (modules), the C++ GEMM vs oneDNN, 13 <= B <= 128

`kernel`: best of 6 x 7 passes over random weights of SmolLM2-135M's shapes (30 layers of qkv 960 x 576,
o 576 x 576, gate_up 3072 x 576, down 576 x 1536, and the 49,152 x 576 head), one pass = each product
once, as a batch-1..M decode step reads them (538 MB: nothing stays in cache between passes).
`gemv` / `layer` / `gemm`: the engine (models/smollm2-135m-instruct) at batch B after P-token prompts, the two
sides switched on alternate steps (every PackedLinear's `small_gemv` or `panels`; the runner's `fast_decode`), so
both see the same machine minute. Prints min / p25 / median per side. torch's threads (2 here).
DTYPE=bfloat16 runs the engine sides in bf16 (`layer` only: the GEMV and GEMM are fp32).
(docs/perf/2026-12-03-decode-gemv.md)
"""
import os
import random
import statistics as st
import sys
import time

import torch

from reference_engine.kernels import cpp_gemv
from reference_engine.model.packed_linear import PackedLinear

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def kernel(rows: list[int]) -> None:
    ws = [torch.randn(n, k) * 0.02 for n, k in SHAPES]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w) for w in ws]

    def one_pass(f, m: int) -> float:
        xs = {k: torch.randn(m, k) for k in (576, 1536)}
        best = float("inf")
        for _ in range(7):
            t = time.perf_counter()
            for i, (_, k) in enumerate(SHAPES):
                f(i, xs[k])
            best = min(best, time.perf_counter() - t)
        return best * 1e3

    for m in rows:
        a = b = float("inf")
        for _ in range(6):  # alternate, so a slow minute of the machine hits both
            a = min(a, one_pass(lambda i, x: torch.ops.mkldnn._linear_pointwise(x, packed[i], None, "none", [], ""), m))
            b = min(b, one_pass(lambda i, x: cpp_gemv.gemv(x, ws[i], None), m))
        print(f"M={m}: onednn {a:.2f} ms  inferlab {b:.2f} ms  onednn / inferlab {a / b:.2f}", flush=True)


def engine(what: str, b: int, p: int, steps: int) -> None:
    from reference_engine import LLM, SamplingParams
    e = LLM("models/smollm2-135m-instruct", dtype=os.environ.get("DTYPE", "float32"), kv_cache_tokens=b * (p + steps + 80), max_num_seqs=b,
            max_num_batched_tokens=max(2048, b), num_threads=torch.get_num_threads()).engine
    rng = random.Random(0)
    for _ in range(b):
        e.add_request([rng.randrange(3, 49152) for _ in range(p)],
                      SamplingParams(max_tokens=steps + 64, temperature=0.0, ignore_eos=True))
    while any(r.num_computed_tokens < p for r in e.scheduler.running) or e.scheduler.waiting:
        e.step()
    linears = [m for m in e.runner.model.modules() if isinstance(m, PackedLinear)]
    fast = e.runner.fast_decode
    sides = ("modules", "one call per layer") if what == "layer" else ("onednn", "inferlab")
    panels = {m: m.panels for m in linears}

    def use(new: bool) -> None:
        if what == "gemm":
            e.runner.fast_decode = None  # the layer path takes the GEMM whatever the flag says
            for m in linears:
                m.panels = panels[m] if new else None
        elif what == "gemv":
            e.runner.fast_decode = None  # the layer path takes the GEMV whatever the flag says
            for m in linears:
                m.small_gemv = new
        else:
            e.runner.fast_decode = fast if new else None

    times: dict[str, list[float]] = {s: [] for s in sides}
    for i in range(steps + 4):
        use(bool(i % 2))
        t = time.perf_counter()
        e.step()
        if i >= 4:  # the first steps warm both sides up
            times[sides[i % 2]].append(time.perf_counter() - t)
    for side, v in times.items():
        print(f"b={b} {side}: min {min(v) * 1e3:.2f}  p25 {st.quantiles(v, n=4)[0] * 1e3:.2f}  "
              f"median {st.median(v) * 1e3:.2f} ms")


if __name__ == "__main__":
    if sys.argv[1] == "kernel":
        kernel([int(a) for a in sys.argv[2:]] or [1, 4, 8])
    else:
        engine(sys.argv[1], *(int(a) for a in sys.argv[2:5]))
