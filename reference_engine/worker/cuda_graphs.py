"""CUDA graphs for decode steps: capture once per batch-size bucket, pad each step to its bucket, replay.

A decode step of a small model is mostly host time: a dozen kernel launches per layer, each a few
microseconds of Python and driver work, for kernels that run for less than that. A CUDA graph
records the launches once; replaying it is one launch. As in vLLM and nano-vllm:

    capture (largest bucket first, every graph in one memory pool):
        for b in sizes:  forward(b) once eagerly (compiles kernels, sizes workspaces), then record
                         forward(b) = model over the first b rows of the step buffers -> hidden states,
                         copied into one static (max bucket, hidden) buffer outside the pool
    each eligible step of n decodes:
        b = bucket(n) (the smallest size >= n); fill the buffers, padded to b; replay graph b;
        rows [:n] of the static buffer go on, eagerly, to the LM head and sampling (launched while
        the graph still runs, so they cost no wall time, and only for the n real rows)

Invariants:
- a graph replays the kernels, pointers and sizes it recorded: every input lives in the runner's
  persistent buffers (`input_batch.StepInputs`), every bound is fixed per bucket (B = N = b,
  max_query_len 1, max_seq_len = max_model_len, a fixed number of key splits), and the attention
  backend is graph-safe (reads device tensors only, accepts padding);
- padding rows (n..b-1) have zero query tokens and zero context and write their KV nowhere
  (slot -1); their output rows are garbage and never read;
- eligible: every sequence has one query token and samples it, no draft tokens, n <= the largest
  bucket, no draft model running on the step's inputs; any other step runs eagerly.

`Graph` is `torch.cuda.CUDAGraph` on CUDA; `EagerGraph` has its interface and re-runs the recorded
function on replay, so everything around capture is tested on CPU (tests/reference_engine).
"""
from __future__ import annotations

import bisect
import contextlib
import time
from typing import Callable

import torch

Forward = Callable[[int], torch.Tensor]  # bucket b -> hidden states (b, hidden), a view of a static buffer


def capture_sizes(sizes: list[int], max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """The buckets actually captured: sorted, unique, none above what one step can hold."""
    limit = min(max_num_seqs, max_num_batched_tokens)
    return sorted({s for s in sizes if 1 <= s <= limit})


def bucket_for(sizes: list[int], n: int) -> int | None:
    """The smallest captured size >= n (sizes sorted), or None when n is above them all."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def graphs_wanted(device: torch.device, enforce_eager: bool, graph_safe: bool) -> bool:
    """CUDA graphs are used on CUDA, unless turned off, with a backend that can be captured."""
    return device.type == "cuda" and not enforce_eager and graph_safe


class EagerGraph:
    """`torch.cuda.CUDAGraph`'s interface without CUDA: `replay` re-runs the captured function, which
    reads the same persistent buffers a real graph would. For CPU tests of bucketing and padding."""

    def __init__(self):
        self.fn: Callable[[], object] | None = None

    def capture(self, fn: Callable[[], object]) -> object:
        self.fn = fn
        return fn()

    def replay(self) -> object:
        return self.fn()


class CudaGraphs:
    """Decode graphs per bucket over `forward(b)`. `eager=True` records `EagerGraph`s (any device)."""

    def __init__(self, forward: Forward, sizes: list[int], device: torch.device, eager: bool = False):
        self.forward, self.sizes, self.device, self.eager = forward, list(sizes), device, eager
        self.graphs: dict[int, object] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        self.capture_s = 0.0
        self.enabled = True  # off: every step runs eagerly (eager-vs-graph comparisons in scripts/gpu/)

    def capture(self) -> None:
        t = time.perf_counter()
        for b in reversed(self.sizes):  # largest first: later graphs reuse its pool memory
            if self.eager:
                g = EagerGraph()
                self.outputs[b] = g.capture(lambda b=b: self.forward(b))
            else:
                self.forward(b)  # warm-up outside the graph: Triton compiles, cuBLAS sizes its workspace
                torch.cuda.synchronize(self.device)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    self.outputs[b] = self.forward(b)
                if self.pool is None:
                    self.pool = g.pool()
            self.graphs[b] = g
        if not self.eager:
            torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t

    def bucket(self, n: int) -> int | None:
        return bucket_for(self.sizes, n) if self.enabled and self.graphs else None

    def replay(self, b: int, n: int) -> torch.Tensor:
        """Run bucket b's graph on the buffers as filled (padded to b) -> its output's rows [:n]. The
        output is a static buffer every graph writes: use it before the next replay."""
        out = self.graphs[b].replay()
        return (out if self.eager else self.outputs[b])[:n]


@contextlib.contextmanager
def no_graphs(graphs: CudaGraphs | None):
    """Run the steps inside eagerly (graphs kept, not replayed)."""
    if graphs is None:
        yield
        return
    was, graphs.enabled = graphs.enabled, False
    try:
        yield
    finally:
        graphs.enabled = was
