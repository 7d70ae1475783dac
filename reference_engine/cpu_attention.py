"""CPU attention backend ("cpu"): `TorchBackend`'s contract, with decode steps in a C++ kernel.

`TorchBackend` gathers every decoding sequence's whole context into a fresh tensor each layer and
step, then runs SDPA on it; at batch 128 that copy moves more bytes than the weights. Here the
decode batch goes to `kernels/cpu_attention.py`, which reads keys and values in place through
the block table (one task per sequence, or per sequence and kv-head range when sequences are
fewer than threads), so each cached row is read once per layer and nothing is allocated.
Writing the step's K/V into the cache and prefill chunks (SDPA on the chunk, a gather only when
earlier context is cached) are `TorchBackend`'s code.

Picked by default on CPU when the kernel builds (`default_attention_backend`); float32 and
bfloat16 caches (bf16 is widened to fp32 as it is read, scores and sums in fp32). Other dtypes
fall back to `TorchBackend._decode`. tests/reference_engine/test_cpu_attention.py checks it
against `TorchBackend`.
"""
from __future__ import annotations

import functools

import torch

from reference_engine.attention import TorchBackend
from reference_engine.kernels import cpu_attention as kernel

DTYPES = (torch.float32, torch.bfloat16)


class CpuBackend(TorchBackend):
    """Decodes through the C++ kernel; everything else as `TorchBackend`."""

    def _decode(self, q, k_cache, v_cache, meta, scale):
        if q.dtype not in DTYPES or k_cache.dtype != q.dtype or q.device.type != "cpu":
            return super()._decode(q, k_cache, v_cache, meta, scale)
        nd = q.shape[0]
        out = torch.empty_like(q)  # (B, H, D)
        kernel.module().decode(q.contiguous(), k_cache, v_cache, _long(meta.block_tables[:nd]),
                               _long(meta.seq_lens[:nd]).contiguous(), float(scale), out)
        return out


def _long(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 else t.long()


@functools.cache
def available() -> bool:
    """Does the kernel build and load here? (a C++ compiler with OpenMP is needed)"""
    if not kernel.compiler_available():
        return False
    try:
        kernel.module()
    except Exception:  # no compiler, headers or OpenMP: the torch backend serves instead
        return False
    return True


def backend_class() -> type[CpuBackend]:
    """What `attention.get_backend("cpu")` returns; a one-line ImportError when the kernel cannot build."""
    if not available():
        raise ImportError("attention backend 'cpu' needs a C++ compiler with OpenMP to build its kernel "
                          "(torch.utils.cpp_extension); use attention_backend='torch'")
    return CpuBackend
