"""A C++ CPU GEMM for fp32 linear layers on W packed in 32-column panels: AVX-512, AVX2 + FMA or scalar.

At 64 decode rows (an offline batch) SmolLM2's step is ~75 % GEMM, and oneDNN's packed kernel there
reads W from memory and multiplies in turns: its time is about the arithmetic plus the read
(docs/perf/2026-12-03-gemm.md). This kernel keeps the next panel of W in flight while the current
one is multiplied, and needs no horizontal sums (the GEMV's dot products do: kernels/cpp_gemv.py).

Layout: W (N, K) is packed once into panels of NR = 32 output columns, k-major,

    packed[p, k, j] = W[p * NR + j, k]        (P, K, NR), zero past N

so one k step of a panel is two AVX-512 vector loads (four AVX2 ones). The micro-kernel holds an
MR x NR tile of y in registers (AVX-512: MR = 12 rows of x, 24 accumulators; AVX2: MR = 3, 12), and
for each k broadcasts x[m, k] into an FMA with the panel's vectors: no shuffles. A panel is taken 128 k
at a time (16 KB, in L1 beside the row tile's x) by every row group of x in turn, the first of them
prefetching the next slice; partial sums wait in a per-thread tile (a store and a load change no
rounding). Threads grab spans of panels from a shared counter (common.h's `share`, as the GEMV: a
thread the OS took away does less).

Rounding: y[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 0], W[n, 0], 0)) in k order, then + bias:
one fixed sequence per output whatever M, the tile, the thread or the instruction set (the scalar
build rounds with std::fma, once per step, as the vector FMAs do), so rows are batch-invariant and the
three builds give the same bits.

    pack(W (N, K) fp32) -> (P, K, NR)
    gemm(x (M, K) fp32 rows, packed, N, bias (N,) or empty) -> y (M, N)

Source: csrc/linear.cpp (it serves any row count; PackedLinear takes it for SMALL_M + 1 to MID_M).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from reference_engine.kernels import cpu_build

NR = 32  # output columns per panel: two AVX-512 vectors, four AVX2 ones

def module():
    """The kernels' extension (cpu_build.module: one build of csrc/, cached on disk)."""
    return cpu_build.module()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """W (N, K) fp32 -> (P, K, NR) panels, k-major, zero past N: packed[p, k, j] = W[p * NR + j, k]."""
    n, k = weight.shape
    p = -(-n // NR)
    w = F.pad(weight.detach().float(), (0, 0, 0, p * NR - n))  # (P * NR, K)
    return w.view(p, NR, k).transpose(1, 2).contiguous()  # (P, K, NR)


def gemm(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x @ W.T (+ bias) for x (M, K) fp32 rows and `packed` = pack(W) of W (n, K)."""
    return module().linear(x, packed, n, bias if bias is not None else x.new_empty(0))


@functools.cache
def available() -> bool:
    """Does the kernel build and load here? (cpu_build.builds: a C++ compiler with OpenMP is needed)"""
    return cpu_build.builds(module)
