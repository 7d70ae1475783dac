"""The C++ GEMM (kernels/cpp_gemm.py) against oneDNN's packed linear, over one pass of a model's products.

    .venv/bin/python scripts/gemm_ab.py [smollm2|small|tiny] M [M ...]      e.g. smollm2 16 64 128 2048

One pass = every linear product of a forward step once, each with its own weights (SmolLM2: 30 layers x
qkv 960 x 576, o 576 x 576, gate_up 3072 x 576, down 576 x 1536, and the 49,152 x 576 head; 538 MB, so
nothing stays in cache between passes). The two sides alternate, best of REPS (4) passes each, so both
see the same minute of the machine. torch's threads (2 here). Also prints the largest difference
between the two sides' outputs relative to the output's scale.
"""
import os
import sys
import time

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from reference_engine.kernels import cpp_gemm  # noqa: E402

MODELS = {  # hidden, intermediate, q + 2 kv heads x 64, layers, vocab
    "smollm2": (576, 1536, 960, 30, 49152),
    "small": (768, 2048, 1280, 12, 32768),
    "tiny": (256, 1024, 384, 4, 8192),
}


def main(model: str, rows: list[int]) -> None:
    h, i, qkv, layers, vocab = MODELS[model]
    shapes = [(qkv, h), (h, h), (2 * i, h), (h, i)] * layers + [(vocab, h)]
    ws = [torch.randn(n, k) * 0.02 for n, k in shapes]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w) for w in ws]
    ours = [cpp_gemm.pack(w) for w in ws]
    sides = {
        "onednn": lambda j, x: torch.ops.mkldnn._linear_pointwise(x, onednn[j], None, "none", [], ""),
        "inferlab": lambda j, x: cpp_gemm.gemm(x, ours[j], shapes[j][0], None),
    }
    flop = 2 * sum(n * k for n, k in shapes)
    for m in rows:
        xs = {k: torch.randn(m, k) for k in (h, i)}
        best = dict.fromkeys(sides, float("inf"))
        for _ in range(int(os.environ.get("REPS", 4))):
            for name, f in sides.items():
                t = time.perf_counter()
                for j, (_, k) in enumerate(shapes):
                    f(j, xs[k])
                best[name] = min(best[name], time.perf_counter() - t)
        a, b = sides["onednn"](len(shapes) - 1, xs[h]), sides["inferlab"](len(shapes) - 1, xs[h])
        diff = ((a - b).abs().max() / a.abs().max()).item()
        print(f"{model} M={m}: onednn {best['onednn'] * 1e3:.2f} ms ({m * flop / best['onednn'] / 1e9:.0f} GFLOP/s)  "
              f"inferlab {best['inferlab'] * 1e3:.2f} ms ({m * flop / best['inferlab'] / 1e9:.0f} GFLOP/s)  "
              f"onednn / inferlab {best['onednn'] / best['inferlab']:.2f}  (head outputs differ by {diff:.1e})",
              flush=True)


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("THREADS", torch.get_num_threads())))
    main(sys.argv[1], [int(a) for a in sys.argv[2:]])
