"""The C++ CPU GEMM of every fp32 linear layer, on W's one resident copy: 32-column k-major panels.
AVX-512, AVX2 + FMA or scalar (cpu_build picks the build from torch's CPU capability).

One kernel for every row count: a decode step (1-12 rows; the dot-product GEMV on W as stored it
replaces read the same bytes), a decode batch (13-128; oneDNN's packed kernel reads W and multiplies
in turns, this one keeps the next panel in flight: docs/perf/2026-12-03-gemm.md) and prefill
(hundreds to thousands of rows, where oneDNN's copy served until 2026-12-04). No horizontal sums.

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

Source: csrc/linear.cpp. `unpack` is pack's inverse (PackedLinear.weight, read on demand).
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


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    """pack's inverse: (P, K, NR) panels -> W (n, K), a fresh contiguous copy."""
    p, k, _ = packed.shape
    return packed.transpose(1, 2).reshape(p * NR, k)[:n].contiguous()  # (P, NR, K) -> (P * NR, K) -> (n, K)


def gemm(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x @ W.T (+ bias) for x (M, K) fp32 rows and `packed` = pack(W) of W (n, K)."""
    return module().linear(x, packed, n, bias if bias is not None else x.new_empty(0))


@functools.cache
def available() -> bool:
    """Does the kernel build and load here? (cpu_build.builds: a C++ compiler with OpenMP is needed)"""
    return cpu_build.builds(module)
