"""CPU attention backend ("cpu"): `TorchBackend`'s contract, with decodes and prefills in C++ kernels.

`TorchBackend` gathers every decoding sequence's whole context into a fresh tensor each layer and
step, then runs SDPA on it; at batch 128 that copy moves more bytes than the weights. Here the
decode batch goes to the C++ decode kernel (`kernels/ops.decode`), which reads keys and values in place
through the block table, so each cached row is read once per layer and nothing is allocated. Prefill
chunks go to its prefill (`ops.prefill`), which reads context (prefix-cached blocks, earlier chunks) the
same way, in place; `TorchBackend` runs SDPA per sequence and gathers cached context. Writing the step's
K/V into the cache is one C++ pass (`ops.kv_write`), what `TorchBackend`'s `index_copy_` writes.

Picked by default on CPU where the kernels build (`default_attention_backend`, `ops.available`); float32 and
bfloat16 caches (bf16 is widened to fp32 as it is read, scores and sums in fp32). Where the bf16 GEMM
runs on AMX, bf16 prefills take the AMX kernel (`amx_prefill`, `ops.prefill_amx`): its sums are the tile
unit's, P is rounded to bf16 before P V (as FlashAttention), so its bits are its own; rows stay
batch-invariant. Other dtypes fall back to `TorchBackend`. tests/reference_engine/attention/test_cpu_backend.py
checks it against `TorchBackend`.
"""
from __future__ import annotations

import torch

from reference_engine.attention.torch_backend import TorchBackend
from reference_engine.kernels import ops

DTYPES = (torch.float32, torch.bfloat16)


class CpuBackend(TorchBackend):
    """Decodes and prefills through the C++ kernels; writing K/V and other dtypes as `TorchBackend`."""

    def new_step(self) -> None:
        self._plan = None

    def forward(self, layer, q, k, v, meta, scale):
        k_cache, v_cache = self.kv[layer]
        if q.dtype not in DTYPES or k_cache.dtype != q.dtype or q.device.type != "cpu":
            return super().forward(layer, q, k, v, meta, scale)
        d = k_cache.shape[3]
        ops.kv_write(k, v, k_cache, v_cache, _long(meta.slot_mapping))  # what TorchBackend's index_copy_ writes
        nd, n = meta.num_decodes, q.shape[0]
        out = torch.empty_like(q)  # (N, H, D)
        tables, lens, starts = self._step_plan(meta)
        if nd:
            ops.decode(q[:nd].contiguous(), k_cache, v_cache, tables[:nd], lens[:nd], float(scale), out[:nd])
        if n > nd:  # prefill chunks: their rows follow the decodes' (the batch layout invariant)
            if amx_prefill(q.dtype, d, k_cache.numel()):  # q read in place: a view of the qkv projection's rows
                ops.prefill_amx(q[nd:], k_cache, v_cache, tables[nd:], lens[nd:], starts, float(scale), out[nd:])
            else:
                ops.prefill(q[nd:].contiguous(), k_cache, v_cache, tables[nd:], lens[nd:], starts, float(scale),
                            out[nd:])
        return out

    def _step_plan(self, meta):
        """int64 block tables, lengths and prefill offsets, made once per step and shared by every layer."""
        plan = getattr(self, "_plan", None)
        if plan is None or plan[0] is not meta:
            nd = meta.num_decodes
            starts = torch.tensor(meta.query_start[nd:], dtype=torch.int64) - meta.query_start[nd]
            plan = self._plan = (meta, _long(meta.block_tables), _long(meta.seq_lens).contiguous(), starts)
        return plan[1:]


def amx_prefill(dtype: torch.dtype, head_dim: int, cache_numel: int = 0) -> bool:
    """Do bf16 prefills take the AMX kernel (csrc/attention_amx.cpp: both products on tiles, P in bf16)? Where
    the bf16 GEMM runs on AMX (`ops.amx_ready`, INFERLAB_AMX not 0), for head sizes that are multiples of 32
    and a layer's cache under 8 GB (its gathers take 32-bit offsets)."""
    return dtype == torch.bfloat16 and head_dim % 32 == 0 and cache_numel < 2 ** 32 and ops.amx_ready()


def _long(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 else t.long()


def backend_class() -> type[CpuBackend]:
    """What `attention.get_backend("cpu")` returns; a one-line ImportError when the kernels cannot build."""
    if not ops.available():
        raise ImportError("attention backend 'cpu' needs a C++ compiler with OpenMP to build its kernel "
                          "(torch.utils.cpp_extension); use attention_backend='torch'")
    return CpuBackend
