"""C++ CPU kernels for attention over the paged KV cache, compiled on first use.

`decode(q, k_cache, v_cache, block_tables, seq_lens, scale, out)`: one query token per sequence,

    q (B, H, D), k_cache / v_cache (num_blocks, block_size, Hkv, D), block_tables (B, max_blocks) int64,
    seq_lens (B,) int64 context length (the query's own key included), out (B, H, D)

`prefill(...)`: chunks of several query tokens per sequence, causal (`cpp_prefill.py`).

Source: csrc/attention_decode.cpp; what decode and prefill share (the weighted sum of value rows) is
csrc/attention.h.

Decode: one task per (sequence, kv head), spread over torch's intra-op threads (`at::parallel_for`). A task
walks its sequence's blocks through the block table, reading each key and value row of its kv
head once, for the H/Hkv query heads that share it (GQA), with an online softmax in float32; no
context is copied. fp32 or bf16 q/cache (bf16 is widened to fp32 as it is read); out has q's dtype.
The G query heads are register-blocked three at a time (`scores8`, `accumulate16`): each key and value
chunk is loaded once for them, and every sum keeps the order of the one-head-at-a-time loops, so the
results are bit-identical to them (SmolLM2, batch 8, context 170, one thread: 8.0 vs 9.0-12.9 ms per
30 layers, docs/perf/2026-12-02-served-decode-profile.md).

Built with the other kernels by `cpu_build.module` (a C++ compiler with OpenMP; at `make setup` or on
first use, then cached on disk per CPU vector ISA).
"""
from __future__ import annotations

from reference_engine.kernels import cpu_build


def module():
    """The kernels' extension (cpu_build.module: one build of csrc/, cached on disk)."""
    return cpu_build.module()
