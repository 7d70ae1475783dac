"""Lab 13 — why GPUs idle in decode: arithmetic intensity and the roofline.

Smallest working piece: one matmul y = x @ W.T, the op that dominates a transformer step. Reading W
costs the same whatever the batch; the FLOPs grow with it. So at small batch the time is set by bytes
(memory-bound) and the time per row falls as rows share the read; at large batch FLOPs set it (compute-bound). We
time it here on the CPU, then put the same arithmetic to an H200 and to our own GPU check's numbers.

    python docs/handbook/labs/13_roofline.py
"""
import importlib.util
import re
import sys
import time
from pathlib import Path

import torch

from reference_engine.make_model import build_config, param_count

torch.manual_seed(0)
K = N = 2048
W = torch.randn(N, K)  # 16 MiB in float32: larger than the CPU's caches, like weights in HBM
print(f"W {tuple(W.shape)} float32 = {W.numel() * 4 / 2**20:.0f} MiB")
print(f"{'batch':>6} {'ms':>8} {'ms/row':>8} {'GFLOP/s':>9} {'GB/s':>7} {'FLOP/byte':>10}")
best_flops = best_bw = 0.0
for b in (1, 2, 4, 8, 32, 128):
    x = torch.randn(b, K)
    x @ W.T  # warm up
    reps = []
    for _ in range(5):
        t0 = time.perf_counter()
        x @ W.T
        reps.append(time.perf_counter() - t0)
    t = sorted(reps)[2]
    flops, bytes_ = 2 * b * K * N, 4 * (K * N + b * K + b * N)
    best_flops, best_bw = max(best_flops, flops / t), max(best_bw, bytes_ / t)
    print(f"{b:>6} {t * 1e3:8.2f} {t * 1e3 / b:8.3f} {flops / t / 1e9:9.1f} {bytes_ / t / 1e9:7.1f} "
          f"{flops / bytes_:10.1f}")
print(f"ms/row falls while reading W is shared by more rows (memory-bound), then levels off (compute-bound).\n"
      f"This CPU's ridge is low: ~{best_flops / 1e9:.0f} GFLOP/s over ~{best_bw / 1e9:.0f} GB/s = "
      f"{best_flops / best_bw:.0f} FLOP/byte. A GPU's is ~200, so its flat region lasts much longer.\n")

# The same arithmetic on an H200 (NVIDIA's data sheet: 4.8 TB/s HBM3e, ~989 TFLOPS dense BF16).
BW, PEAK = 4.8e12, 989e12
print(f"H200 ridge point: {PEAK:.3g} / {BW:.3g} = {PEAK / BW:.0f} FLOP/byte; in bf16 a decode matmul does "
      f"2B FLOPs per 2 weight bytes = B FLOP/byte, so it is bandwidth-bound until batch ~{PEAK / BW:.0f}")
w8b = 8.03e9 * 2  # Llama-3.1-8B weights in bf16
print(f"Llama-3.1-8B decode step at batch 1: {w8b / 1e9:.1f} GB / {BW / 1e12:.1f} TB/s = {w8b / BW * 1e3:.2f} ms "
      f"at best -> at most {BW / w8b:.0f} tokens/s for one sequence, whatever the FLOPs")

# Our own GPU check (docs/perf): the `small` preset decoding 64 sequences on the H200.
root = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("build_tables", root / "docs/handbook/build_tables.py")
bt = importlib.util.module_from_spec(spec)
sys.modules["build_tables"] = bt  # dataclasses look their module up while the file executes
spec.loader.exec_module(bt)
rows = bt.select(bt.TABLES["h200-decode-speed"], (root / bt.H200).read_text())
ref = next(r for r in rows[1:] if r[0] == "reference" and r[1] == "float32")
seconds = float(ref[2])
cfg = build_config("small", "llama")
weights = param_count(cfg) * 4
kv_tok = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
steps, seqs, mean_ctx = 128, 64, 128 + 64  # 128 prompt + 128 output tokens: mean context 192
per_step = weights + seqs * mean_ctx * kv_tok
print(f"our H200 run (reference, float32): {seconds} s for {seqs} x {steps} tokens -> ~{seconds / steps * 1e3:.1f} ms "
      f"per step; bytes per step {per_step / 1e6:.0f} MB -> floor {per_step / BW * 1e3:.3f} ms: "
      f"the floor is ~{per_step / BW / (seconds / steps):.1%} of the measured step: "
      f"the rest is overhead (Python, launches)")
assert re.fullmatch(r"[\d.]+", ref[2])
