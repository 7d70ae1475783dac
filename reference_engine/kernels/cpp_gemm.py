"""A C++ CPU GEMM for fp32 linear layers past a decode's few rows, on a packed copy of W.

At 64 decode rows (an offline batch) SmolLM2's step is ~75 % GEMM, and oneDNN's packed kernel there
reads W from memory and multiplies in turns: its time is about the arithmetic plus the read
(docs/perf/2026-12-03-gemm.md). This kernel keeps the next panel of W in flight while the current
one is multiplied, and needs no horizontal sums (the GEMV's dot products do: kernels/cpp_gemv.py).

Layout: W (N, K) is packed once into panels of NR = 32 output columns, k-major,

    packed[p, k, j] = W[p * NR + j, k]        (P, K, NR), zero past N

so one k step of a panel is two vector loads. The micro-kernel holds an MR x NR tile of y in 24
vector registers (MR = 12 rows of x, two 16-lane vectors of columns), and for each k broadcasts
x[m, k] into an FMA with the panel's two vectors: 24 FMAs per 14 loads, no shuffles. A panel is
taken 256 k at a time (32 KB, in L1) by every row group of x in turn, the first of them prefetching
the next slice; partial sums wait in y (a store and a load change no rounding). Threads grab spans
of panels from a shared counter (as the GEMV: a thread the OS took away does less).

Rounding: y[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 0], W[n, 0], 0)) in k order, then + bias:
one fixed sequence per output whatever M, the tile or the thread, so rows are batch-invariant.
Needs AVX-512 (`available()` is False elsewhere: PackedLinear keeps oneDNN).

    pack(W (N, K) fp32) -> (P, K, NR)
    gemm(x (M, K) fp32 rows, packed, N, bias (N,) or empty) -> y (M, N)

Source: csrc/gemm.cpp.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from reference_engine.kernels import cpu_build

NR = 32  # output columns per panel: two AVX-512 vectors

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
    return module().gemm(x, packed, n, bias if bias is not None else x.new_empty(0))


@functools.cache
def available() -> bool:
    """Does the kernel build here and does this CPU have AVX-512 (its only code path)?"""
    return torch.backends.cpu.get_cpu_capability() == "AVX512" and cpu_build.builds(module)
