"""A C++ CPU kernel for the decode-sized fp32 linear layer: a few rows of x against all of W.

At decode a linear layer's cost is one read of W from memory (SmolLM2 at batch 1: 538 MB per step,
121 products). oneDNN's packed GEMM reaches the memory bandwidth on large shapes, but on this
model's small ones (576 x 576, 960 x 576) a call is short enough that its start-up shows, at 8
rows it computes one row group after the other while no read is in flight, and its static split of
the rows between threads makes the whole product wait for a thread that the OS (or the HTTP front
end's process, on a 2-core machine) has interrupted (docs/perf/2026-12-03-decode-gemv.md).

It reads W (N, K) as nn.Linear stores it (no packed copy) as dot products: a tile of MR rows of x
against NR rows of W, each pair summed in one vector register over k, the lanes folded to 8 and
added in one fixed tree (`reduce8`):

    y[m, n] = tree(sum over k in vector steps of x[m, k:k+L] * W[n, k:k+L]) + the k % L tail

Each output is that same sequence of roundings whatever the tile it lands in and however rows are
spread over threads: the result depends neither on the batch (batch-invariant) nor on the thread
count. Scheduling, and why:
- every row group of x goes over a tile of W while the tile is in L1, and the next tile of W is
  prefetched meanwhile, so the memory read never pauses for the arithmetic (8 rows: 1.2x oneDNN);
  one row of x (batch 1) has too little arithmetic to hide anything behind: there the software
  prefetch only competed with the hardware's (no prefetch, 16-row tiles: a pass over SmolLM2's
  weights 5-11 % faster; at 4-8 rows dropping it cost 20-60 %);
- threads grab spans of W's rows from a shared counter, each 1 / (2 x threads) of what is left
  (guided): long spans keep the prefetch streaming, the short last ones let a thread that got
  less CPU simply do less, instead of everyone waiting for it at the end.

    gemv(x (M, K) fp32 rows, W (N, K) fp32 contiguous, bias (N,) or empty) -> y (M, N)

Source: csrc/gemv.cpp (the work sharing is common.h's `share`).
"""
from __future__ import annotations

import functools

import torch

from reference_engine.kernels import cpu_build


def module():
    """The kernels' extension (cpu_build.module: one build of csrc/, cached on disk)."""
    return cpu_build.module()


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x @ weight.T (+ bias) for x (M, K) fp32 rows and weight (N, K) fp32, contiguous."""
    return module().gemv(x, weight, bias if bias is not None else x.new_empty(0))


@functools.cache
def available() -> bool:
    """Does the kernel build and load here? (cpu_build.builds: a C++ compiler with OpenMP is needed)"""
    return cpu_build.builds(module)
