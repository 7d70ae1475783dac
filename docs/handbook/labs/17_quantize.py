"""Lab 17 — quantization: fewer bytes per weight, read faster, at a cost in accuracy.

Smallest working piece: one Q4_1 block of the GGUF file SmolLM2-135M-Instruct ships in: 32 weights in 20
bytes, an fp16 scale d and an fp16 minimum m, then 32 four-bit codes q, each weight d * q + m. The lab
decodes one block by hand and checks it against the `gguf` package's dequantizer bit for bit. Then it
times one decode-shaped matrix-vector product y = W x on this CPU with W in fp32, bf16 and int8 (one
scale per row), W larger than the last-level cache, one pinned thread, and sets each one's weight bytes
÷ time against this machine's copy bandwidth; the verdicts are computed from those numbers. Last, what
the fewer bits cost: the error each format puts in y, on the same matrix.

    python docs/handbook/labs/17_quantize.py [--repeats 7]
"""
import argparse
import mmap
import os
import statistics
import struct
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from reference_engine.model.gguf import shipped_gguf

ap = argparse.ArgumentParser()
ap.add_argument("--repeats", type=int, default=7, help="timed passes per format (the fastest is the estimate)")
args = ap.parse_args()


# 1. One Q4_1 block, by hand. The GGUF sits in the cached wheel `inferlab make-model` downloaded.
def gguf_path() -> Path:
    return shipped_gguf("smollm2-135m-instruct")  # extracted once, next to the wheel


def tensors(buf) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType, int]]:
    """The GGUF's tensor table, read by hand: (name, shape as stored, type, absolute byte offset). After the
    header come key-value pairs (skipped here, walking their types), then one entry per tensor, then the data,
    aligned to general.alignment (32 unless set)."""
    pos = 0

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return vals if len(vals) > 1 else vals[0]

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return bytes(buf[pos - n:pos]).decode()

    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(kind):
        if kind == 8:
            return string()
        if kind == 9:  # array: element type, count, elements
            elem, n = take("I"), take("Q")
            return [value(elem) for _ in range(n)]
        return take(sizes[kind])

    assert bytes(buf[:4]) == b"GGUF"
    pos = 4
    _version, n_tensors, n_kv = take("I"), take("Q"), take("Q")
    align = 32
    for _ in range(n_kv):
        key, kind = string(), take("I")
        v = value(kind)
        align = v if key == "general.alignment" else align
    table = []
    for _ in range(n_tensors):
        name, dims = string(), take("I")
        shape = tuple(take("Q") for _ in range(dims))
        table.append((name, shape, GGMLQuantizationType(take("I")), take("Q")))
    data = -(-pos // align) * align
    return [(n, s, k, data + off) for n, s, k, off in table]


def q4_1_block(raw: bytes) -> np.ndarray:
    """20 bytes -> 32 float32 weights: d (fp16), m (fp16), then 16 bytes holding codes 0-15 (low nibbles are
    weights 0-15, high nibbles weights 16-31); weight = d * q + m."""
    d = np.frombuffer(raw[0:2], np.float16).astype(np.float32)[0]
    m = np.frombuffer(raw[2:4], np.float16).astype(np.float32)[0]
    qs = np.frombuffer(raw[4:20], np.uint8)
    q = np.concatenate([qs & 0x0F, qs >> 4]).astype(np.float32)
    return d * q + m


with open(gguf_path(), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
    table = tensors(buf)
    types: dict[str, list[int]] = {}
    for name, shape, kind, _ in table:
        n = int(np.prod(shape))
        block, size = GGML_QUANT_SIZES[kind]
        types.setdefault(kind.name, [0, 0])
        types[kind.name][0] += n
        types[kind.name][1] += n // block * size
    print(f"SmolLM2-135M-Instruct's GGUF ({len(table)} tensors): " + "; ".join(
        f"{k} {n / 1e6:.1f} M weights in {b / 1e6:.1f} MB ({8 * b / n:.2f} bits per weight)" for k, (n, b) in types.items()))
    name, shape, kind, at = next(t for t in table if t[2] == GGMLQuantizationType.Q4_1)
    raw = bytes(buf[at:at + 20])
by_hand = q4_1_block(raw)
by_gguf = dequantize(np.frombuffer(raw, np.uint8).reshape(1, 20), GGMLQuantizationType.Q4_1).reshape(-1)
codes = np.concatenate([np.frombuffer(raw[4:], np.uint8) & 15, np.frombuffer(raw[4:], np.uint8) >> 4]).tolist()
d, m = (float(np.frombuffer(raw[i:i + 2], np.float16)[0]) for i in (0, 2))
print(f"{name} {tuple(reversed(shape))} Q4_1, first block at byte {at:,}: {raw[:2].hex(' ')} | {raw[2:4].hex(' ')} | "
      f"{raw[4:].hex(' ')}")
print(f"  d = {d:.6g}, m = {m:.6g}; codes {codes}")
print(f"  by hand d * q + m: {np.round(by_hand[:4], 5).tolist()} ...; gguf.quants.dequantize of the same 20 bytes: "
      f"{'bit-identical' if np.array_equal(by_hand.view(np.uint32), by_gguf.view(np.uint32)) else 'DIFFERENT'} "
      f"over 32 weights")


# 2. A decode-shaped product y = W x, W in fp32, bf16, int8 with a scale per row.
def timed(fn, repeats: int) -> tuple[float, float]:
    """(fastest seconds, median / fastest - 1): noise only adds time, so the fastest pass is the estimate."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts) / min(ts) - 1


def verdicts(rows: dict[str, tuple[float, float, int]], copy_gbs: float, noisy: float = 0.5) -> list[str]:
    """rows: format -> (fastest s, spread, weight bytes), fp32 first. Each format's reading, from the numbers alone."""
    worst = max(rows, key=lambda k: rows[k][1])
    if rows[worst][1] > noisy:
        return [f"inconclusive on this machine: the median {worst} pass was {rows[worst][1]:.0%} slower than its fastest "
                f"(limit {noisy:.0%}); other work shares the core"]
    base_t, _, base_b = rows["fp32"]
    out = []
    for name, (t, _, b) in rows.items():
        share = b / t / 1e9 / copy_gbs
        speed = base_t / t
        streams = ("near the copy bandwidth" if share >= 0.5 else "at a fraction of the copy bandwidth" if share >= 0.25
                   else "far below the copy bandwidth: its kernel, not memory, sets the time")
        if name == "fp32":
            out.append(f"fp32 (the baseline): {b / t / 1e9:.1f} GB/s = {share:.0%} of the copy bandwidth, {streams}")
            continue
        paid = "faster" if speed >= 1.2 else "slower" if speed <= 1 / 1.2 else "no faster"
        out.append(f"{name}: {base_b / b:.0f}x fewer bytes than fp32 and {speed:.2f}x its speed ({paid}); "
                   f"{b / t / 1e9:.1f} GB/s = {share:.0%} of the copy bandwidth, {streams}")
    return out


os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core: no migration between passes
saved_threads = torch.get_num_threads()
torch.set_num_threads(1)
N = K = 8192  # int8 W = 64 MiB: still at least twice a 32 MiB last-level cache
torch.manual_seed(0)
W = torch.randn(N, K)  # the timing's values do not matter; part 3 measures the error on a matrix of its own
x = torch.randn(1, K)
Wq = torch.randint(-127, 128, (N, K), dtype=torch.int8)  # int8 codes, one scale per output row
scale = torch.rand(N) / 100
Wb, xb, sb = W.bfloat16(), x.bfloat16(), scale.bfloat16()
src = torch.ones(32 * 2**20)  # 128 MiB
dst = torch.empty_like(src)
copy_t, _ = timed(lambda: dst.copy_(src), args.repeats)
copy_gbs = 2 * src.numel() * 4 / copy_t / 1e9  # bytes read + bytes written, as experiments/measuring/bandwidth.py counts
formats = {"fp32": (lambda: x @ W.T, 4), "bf16": (lambda: xb @ Wb.T, 2),
           "int8 (bf16 activations)": (lambda: torch.ops.aten._weight_int8pack_mm(xb, Wq, sb), 1),
           "int8 (fp32 activations)": (lambda: torch.ops.aten._weight_int8pack_mm(x, Wq, scale), 1)}
rows = {}
print(f"W ({N}, {K}) times one vector, 1 thread; copy bandwidth {copy_gbs:.1f} GB/s (read + write, 128 MiB)")
for name, (fn, bytes_per) in formats.items():
    t, spread = timed(fn, args.repeats)
    rows[name] = (t, spread, N * K * bytes_per)
    print(f"  {name:<24} {t * 1e3:7.2f} ms (median +{spread:.0%})  weights {N * K * bytes_per / 2**20:4.0f} MiB  "
          f"{N * K * bytes_per / t / 1e9:5.1f} GB/s")
torch.set_num_threads(saved_threads)
os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
for line in verdicts(rows, copy_gbs):
    print(line)

# 3. What the fewer bits cost: the relative error each format puts in y (fp64 reference), on a Gaussian matrix.
W, x = torch.randn(1024, K), torch.randn(1, K)
exact = (x.double() @ W.double().T)[0]


def rel(y: torch.Tensor) -> float:
    return float((y.double() - exact).norm() / exact.norm())


scale = W.abs().amax(1) / 127  # int8, symmetric, one scale per output row
Wq = torch.round(W / scale[:, None]).clamp(-127, 127)
g = W.reshape(len(W), K // 32, 32)  # int4 with groups of 32 and a minimum, as Q4_1: 16 levels from min to max
lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
step = (hi - lo) / 15
W4 = (torch.round((g - lo) / step) * step + lo).reshape(W.shape)
Wf8 = W / (W.abs().amax(1, keepdim=True) / 448)  # fp8 e4m3 (largest finite value 448), one scale per row
Wf8 = Wf8.to(torch.float8_e4m3fn).float() * (W.abs().amax(1, keepdim=True) / 448)
errors = {"bf16 weights and activations": rel(x.bfloat16() @ W.bfloat16().T),
          "fp8 e4m3 weights, a scale per row": rel(x @ Wf8.T),
          "int8 weights, a scale per row": rel(x @ (Wq * scale[:, None]).T),
          "int4 weights, scale and min per 32 (Q4_1-style)": rel(x @ W4.T)}
print("error in y (relative, against fp64): " + "; ".join(f"{k} {v:.1%}" for k, v in errors.items()))

# An fp8 KV cache: one query attending over 1000 keys and values stored in e4m3 with one scale per tensor.
q, k, v = torch.randn(128), torch.randn(1000, 128), torch.randn(1000, 128)


def fp8(a: torch.Tensor) -> torch.Tensor:
    s = a.abs().max() / 448
    return (a / s).to(torch.float8_e4m3fn).float() * s


ref = torch.softmax(k.double() @ q.double() / 128 ** 0.5, 0) @ v.double()
got = torch.softmax(fp8(k) @ q / 128 ** 0.5, 0) @ fp8(v)
print(f"attention over an fp8 e4m3 KV cache (one scale per tensor): relative error {float((got - ref).norm() / ref.norm()):.1%} "
      f"in the output, for half the bytes of bf16")

# The KV cache in fp8: the engine's own bytes-per-token formula, with a one-byte element.
from reference_engine.config import ModelConfig  # noqa: E402

# Llama-3.1-8B's shape (its config.json), as the engine's own ModelConfig
llama = ModelConfig(architecture="LlamaForCausalLM", family="llama", vocab_size=128256, hidden_size=4096,
                    intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                    rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=None, max_position_embeddings=131072,
                    tie_word_embeddings=False, attention_bias=False, qk_norm=False)
kv16, kv8 = llama.kv_bytes_per_token(torch.bfloat16), llama.kv_bytes_per_token(torch.float8_e4m3fn)
print(f"Llama-3.1-8B KV per token (ModelConfig.kv_bytes_per_token): bf16 {kv16:,} B, fp8 {kv8:,} B: the same pool holds "
      f"{kv16 // kv8}x the tokens; 64 sequences of 8,192 tokens need {64 * 8192 * kv16 / 2**30:.0f} GiB in bf16, "
      f"{64 * 8192 * kv8 / 2**30:.0f} GiB in fp8")

# The worked number: one Llama-3.1-8B decode step at batch 1 on an H200 (4.8 TB/s) reads its matmul weights once.
w = 8.03e9 - 128256 * 4096  # matmul weights (the embedding table is a lookup)
for fmt, bits in (("bf16", 16), ("fp8", 8), ("int4, Q4_1-style (5 bits with its scales)", 5)):
    gb = w * bits / 8 / 1e9
    print(f"Llama-3.1-8B at batch 1 on an H200, {fmt}: {gb:.1f} GB per step -> {gb / 4.8e3 * 1e3:.2f} ms, "
          f"at most {4.8e3 / gb:.0f} tokens/s")
