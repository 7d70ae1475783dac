"""Lab 03 — why GPUs idle in decode: arithmetic intensity and the roofline.

Smallest working piece: one matmul y = x @ W.T, the op that dominates a transformer step. Reading W
costs the same whatever the batch; the FLOPs grow with it. So at small batch the time is set by bytes
(memory-bound) and the time per row falls as rows share the read; at large batch FLOPs set it
(compute-bound). We time it on this CPU, with W larger than the last-level cache this lab detects
(so every pass reads W from DRAM, as a GPU reads weights from HBM), one pinned thread, and repeats;
the closing sentences are computed from the medians and their spread, and say "inconclusive on
this machine" when the spread is larger than the effect. Then the same arithmetic on an H200 and
our own GPU check's numbers.

    python docs/handbook/labs/03_roofline.py [--repeats 7] [--threads 1]
"""
import argparse
import importlib.util
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from reference_engine.model.make import build_config, param_count

ap = argparse.ArgumentParser()
ap.add_argument("--repeats", type=int, default=7, help="timed passes per batch size (median and spread)")
ap.add_argument("--threads", type=int, default=1, help="torch threads, pinned to as many cores")
args = ap.parse_args()


def last_level_cache() -> int | None:
    """Bytes of the largest CPU cache sysfs reports for cpu0 (the L3 on most servers), None if unknown."""
    sizes = []
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        m = re.fullmatch(r"(\d+)([KMG]?)", (d / "size").read_text().strip())
        if m:
            sizes.append(int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)])
    return max(sizes) if sizes else None


saved = os.sched_getaffinity(0), torch.get_num_threads()  # restored after timing (the tests run labs in-process)
cores = sorted(saved[0])[:args.threads]
os.sched_setaffinity(0, cores)  # one core each: no migration between repeats
torch.set_num_threads(args.threads)
llc = last_level_cache()
# W at least 2x the LLC (a 64 MiB floor when the LLC is unknown), 256-aligned, capped at 16384^2 (1 GiB): some
# VMs report the host's whole L3 (480 MiB on one 2-vCPU Xeon guest)
target = max(2 * (llc or 32 * 2**20), 64 * 2**20)
K = N = min(16384, -(-int((target / 4) ** 0.5) // 256) * 256)
torch.manual_seed(0)
W = torch.randn(N, K)
w_bytes = W.numel() * 4
print(f"last-level cache {llc / 2**20:.0f} MiB" if llc else "last-level cache: not reported by sysfs")
print(f"W {tuple(W.shape)} float32 = {w_bytes / 2**20:.0f} MiB "
      f"({'larger than' if llc and w_bytes > llc else 'NOT known to exceed'} the last-level cache); "
      f"{args.threads} thread(s) pinned to core(s) {cores}; {args.repeats} repeats per batch")
print(f"{'batch':>6} {'min ms':>8} {'median':>7} {'ms/row':>8} {'GFLOP/s':>9} {'GB/s':>7} {'FLOP/byte':>10}")
rows = []  # (batch, median s, relative spread, flops, bytes)
for b in (1, 2, 4, 8, 16, 32, 64, 128):
    x = torch.randn(b, K)
    x @ W.T  # warm up
    reps = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        x @ W.T
        reps.append(time.perf_counter() - t0)
    t = min(reps)  # the least-disturbed pass: noise on a shared machine only ever adds time
    spread = statistics.median(reps) / t - 1  # how much a typical pass lost to noise
    flops, bytes_ = 2 * b * K * N, 4 * (K * N + b * K + b * N)
    rows.append((b, t, spread, flops, bytes_))
    print(f"{b:>6} {t * 1e3:8.2f} {spread:+7.0%} {t * 1e3 / b:8.3f} {flops / t / 1e9:9.1f} {bytes_ / t / 1e9:7.1f} "
          f"{flops / bytes_:10.1f}")

os.sched_setaffinity(0, saved[0])
torch.set_num_threads(saved[1])

# Conclusions, computed from the fastest passes; noise = how far the median pass is above the fastest.
def conclude(rows: list[tuple], noisy: float = 0.5) -> list[str]:
    """The lab's verdict lines from its rows (batch, fastest s, relative spread, flops, bytes) alone."""
    noise = max(r[2] for r in rows)
    if noise > noisy:
        worst = max(rows, key=lambda r: r[2])
        return [f"inconclusive on this machine: the median pass at batch {worst[0]} was {worst[2]:.0%} slower than "
                f"the fastest (limit {noisy:.0%}); other processes are sharing the core. Run again on a quiet machine."]
    # per doubling of the batch: ~1x = the rows share one read of W (memory-bound); ~2x = FLOPs set it
    growth = [(rows[i][0], rows[i][1] / rows[i - 1][1]) for i in range(1, len(rows))]
    out = ["time per doubling of the batch: " + ", ".join(f"{b // 2}->{b} {g:.2f}x" for b, g in growth)]
    shared = [b for b, g in growth if g < 1.5]
    outlier = growth[0][1] >= 1.7 and bool(shared) and min(shared) > 2  # 1->2 doubled, later ones did not
    doubled = [b for b, g in growth[outlier:] if g >= 1.7]
    if shared:
        out.append(f"doublings that cost < 1.5x (the read of W shared, memory-bound): up to batch {max(shared)}"
                   + (f"; >= 1.7x (compute-bound): {', '.join(map(str, doubled))}" if doubled else
                      "; no doubling cost >= 1.7x: compute never dominated up to batch " + str(rows[-1][0])))
    else:
        out.append("no doubling cost < 1.5x: no memory-bound range on this machine at these sizes")
    if outlier:
        out.append(f"batch 1 is an outlier: 1->2 cost {growth[0][1]:.2f}x, unlike the doublings after it; "
                   "this lab cannot tell why (a different library code path for a single row is a common cause)")
    bw, peak = rows[0][4] / rows[0][1], max(r[3] / r[1] for r in rows)
    out.append(ridges(peak, bw))
    return out


def ridges(peak: float, bw: float, gpu_ridge: float = 989e12 / 4.8e12) -> str:
    """This CPU's ridge against an H200's, and where each one's memory-bound region ends (from the numbers)."""
    cpu_ridge = peak / bw
    cross_cpu, cross_gpu = 2 * cpu_ridge, gpu_ridge  # float32 here: b/2 FLOP/byte; bf16 there: B FLOP/byte
    longer = ("longer" if cross_gpu > cross_cpu else "shorter") + f" (to batch ~{cross_gpu:.0f} against ~{cross_cpu:.0f})"
    if round(cross_gpu) == round(cross_cpu):
        longer = f"as long (to batch ~{cross_gpu:.0f} on both)"
    return (f"this CPU's ridge: {peak / 1e9:.0f} GFLOP/s (best FLOP rate) / {bw / 1e9:.1f} GB/s (batch 1, memory-bound)"
            f" = {cpu_ridge:.0f} FLOP/byte; in float32 a batch-b matmul does b/2 FLOP/byte, so the roofline puts "
            f"the crossover near batch {cross_cpu:.0f};\n  an H200's ridge is ~{gpu_ridge:.0f} FLOP/byte and a bf16 "
            f"matmul does B FLOP/byte there, so an H200's memory-bound region lasts {longer}\n")


for line in conclude(rows):
    print(line)

# The same arithmetic on an H200 (NVIDIA's data sheet: 4.8 TB/s HBM3e, ~989 TFLOPS dense BF16).
BW, PEAK = 4.8e12, 989e12
print(f"H200 ridge point: {PEAK:.3g} / {BW:.3g} = {PEAK / BW:.0f} FLOP/byte; in bf16 a decode matmul does "
      f"2B FLOPs per 2 weight bytes = B FLOP/byte, so it is bandwidth-bound until batch ~{PEAK / BW:.0f}")
w8b = (8.03e9 - 128256 * 4096) * 2  # Llama-3.1-8B matmul weights in bf16 (the embedding table is a lookup)
print(f"Llama-3.1-8B decode step at batch 1: {w8b / 1e9:.1f} GB / {BW / 1e12:.1f} TB/s = {w8b / BW * 1e3:.2f} ms "
      f"at best -> at most {BW / w8b:.0f} tokens/s for one sequence, whatever the FLOPs")

# Our own GPU check (docs/perf): the `small` preset decoding 64 sequences on the H200.
root = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("build_tables", root / "docs/handbook/build_tables.py")
bt = importlib.util.module_from_spec(spec)
sys.modules["build_tables"] = bt  # dataclasses look their module up while the file executes
spec.loader.exec_module(bt)
table = bt.select(bt.TABLES["h200-decode-speed"], (root / bt.H200).read_text())
ref = next(r for r in table[1:] if r[0] == "reference" and r[1] == "float32")
seconds = float(ref[2])
cfg = build_config("small", "llama")
weights = param_count(cfg) * 4
kv_tok = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
steps, seqs, mean_ctx = 128, 64, 128 + 64  # 128 prompt + 128 output tokens: mean context 192
per_step = weights + seqs * mean_ctx * kv_tok


def h200_reading(seconds: float, tokens: int, seqs: int, per_step: float, bw: float) -> str:
    """What the GPU check's one number allows. Its seconds hold the prefill step too (the first token) and
    tokens - 1 decode steps, so seconds / (tokens - 1) is an upper bound on one decode step, and the
    bandwidth floor's share of a decode step is at least floor / that bound."""
    step = seconds / (tokens - 1)
    share = per_step / bw / step
    if share >= 1:
        return (f"our H200 run: {seconds} s for {seqs} x {tokens} tokens is {step * 1e3:.3f} ms per decode step at most, "
                f"less than the bandwidth floor {per_step / bw * 1e3:.3f} ms: the inputs disagree (a wrong byte count, "
                f"or a wrong bandwidth); nothing can be read from them")
    return (f"our H200 run (reference, float32): {seconds} s for {seqs} sequences x {tokens} tokens = one prefill "
            f"step + {tokens - 1} decode steps -> at most ~{step * 1e3:.1f} ms per decode step; bytes per step "
            f"{per_step / 1e6:.0f} MB -> floor {per_step / bw * 1e3:.3f} ms: the floor is at least ~{share:.1%} of a "
            f"decode step, so up to ~{1 - share:.0%} of it is not bandwidth; what that time is, this run did not profile")


print(h200_reading(seconds, steps, seqs, per_step, BW))
