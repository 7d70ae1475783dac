"""Attention over the paged KV cache, behind a small backend interface.

A backend does two things per layer: write this step's keys/values into their cache
slots, and attend each query token to its sequence's context. The model never sees
block tables; the runner builds `AttentionMetadata` once per step and every layer
reuses it. Backends are registered by name (`torch` here; a Triton GPU backend later).

Batch layout invariant (the runner guarantees it): the first `num_decodes` sequences
have exactly one query token each; prefill (or chunked-prefill) sequences follow.

A backend that can be captured in a CUDA graph (`graph_safe`) reads only device tensors and the
`max_*` / `num_splits` bounds, never the Python lists, and accepts padding: sequences with zero
query tokens and zero context, tokens with slot -1 (written nowhere), their output rows unset.
"""
from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# SDPA backends the torch backend uses on CUDA: all but cuDNN's. cuDNN attention (PyTorch's first
# choice for fp16/bf16 on Hopper since 2.9; it takes no fp32) builds an execution plan for every new
# shape, and a decode step's context length is new every step (docs/engine.md, "bf16 on CUDA").
CUDA_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (N,) int64: flat cache slot of each query token
    block_tables: torch.Tensor  # (B, max_blocks) int32, padded with 0
    seq_lens: torch.Tensor  # (B,) context length after this step (cached + new)
    query_lens: list[int]  # per sequence, python ints (prefill loop bounds)
    seq_lens_list: list[int]
    query_start: list[int]  # (B+1) offsets into the flat token vector
    num_decodes: int
    max_decode_len: int
    # Device-side view of the same step, for backends that never read the lists (graph-safe ones):
    cu_seqlens_q: torch.Tensor | None = None  # (B+1,) int32 query offsets; None: built from query_start
    max_query_len: int | None = None  # bounds fixed per captured graph; None: from the lists
    max_seq_len: int | None = None
    num_splits: int | None = None  # key splits a captured graph uses (Triton); None: the backend picks


class AttentionBackend(abc.ABC):
    """Owns nothing but a reference to the KV cache tensors; stateless across steps (a backend may
    cache a plan per metadata object: `new_step` drops it, for a runner that reuses one object)."""

    graph_safe = False  # may a CUDA graph capture `forward`? (see the module docstring)

    def __init__(self, kv_cache: list[tuple[torch.Tensor, torch.Tensor]], block_size: int):
        self.kv = kv_cache  # per layer: (k, v), each (num_blocks, block_size, Hkv, D)
        self.block_size = block_size

    def new_step(self) -> None:
        """Forget anything cached for the previous step's metadata."""

    def graph_num_splits(self, num_seqs: int, max_seq_len: int) -> int | None:
        """Key splits for a graph of `num_seqs` decodes (fixed at capture); None: not applicable."""
        return None

    @abc.abstractmethod
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: (N, H, D), k/v: (N, Hkv, D) for this step's tokens -> output (N, H, D)."""


class TorchBackend(AttentionBackend):
    """Pure PyTorch: gathers each sequence's blocks and calls SDPA. Runs anywhere."""

    def forward(self, layer, q, k, v, meta, scale):
        k_cache, v_cache = self.kv[layer]
        hkv, d = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, hkv, d).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, hkv, d).index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, meta, scale)
        for i in range(nd, len(meta.query_lens)):
            s, e = meta.query_start[i], meta.query_start[i + 1]
            ctx = meta.seq_lens_list[i]
            if ctx == e - s:  # nothing cached before this chunk: attend to this step's k/v directly
                ks, vs = k[s:e], v[s:e]
            else:
                ks, vs = self._gather(k_cache, v_cache, meta.block_tables[i], ctx)
            out[s:e] = _sdpa(q[s:e].unsqueeze(0), ks.unsqueeze(0), vs.unsqueeze(0), scale,
                             _causal_mask(e - s, ctx, q.device)).squeeze(0)
        return out

    def _gather(self, k_cache, v_cache, table, ctx):
        nblk = -(-ctx // self.block_size)
        blocks = table[:nblk]
        hkv, d = k_cache.shape[2], k_cache.shape[3]
        ks = k_cache[blocks].view(-1, hkv, d)[:ctx]  # (ctx, Hkv, D)
        vs = v_cache[blocks].view(-1, hkv, d)[:ctx]
        return ks, vs

    def _decode(self, q, k_cache, v_cache, meta, scale):
        # One query per sequence: gather all their blocks at once, mask past each length.
        nd, ctx = q.shape[0], meta.max_decode_len
        nblk = -(-ctx // self.block_size)
        tables = meta.block_tables[:nd, :nblk]  # (B, nblk)
        hkv, d = k_cache.shape[2], k_cache.shape[3]
        ks = k_cache[tables].view(nd, -1, hkv, d)[:, :ctx]  # (B, ctx, Hkv, D)
        vs = v_cache[tables].view(nd, -1, hkv, d)[:, :ctx]
        mask = torch.arange(ctx, device=q.device)[None, :] < meta.seq_lens[:nd, None]  # (B, ctx)
        return _sdpa(q.unsqueeze(1), ks, vs, scale, mask[:, None, None, :]).squeeze(1)


def _causal_mask(q_len: int, ctx: int, device) -> torch.Tensor | None:
    """Query j sits at absolute position ctx - q_len + j and sees keys up to it. None = plain causal."""
    if q_len == ctx:
        return None
    rows = torch.arange(ctx - q_len, ctx, device=device)[:, None]
    return (torch.arange(ctx, device=device)[None, :] <= rows)[None, None]  # (1, 1, T, ctx)


def _sdpa(q, k, v, scale, mask):
    """q: (B, T, H, D), k/v: (B, S, Hkv, D), mask broadcastable to (B, H, T, S) or None (causal)."""
    if q.is_cuda:
        with sdpa_kernel(CUDA_SDPA):
            return _sdpa_any(q, k, v, scale, mask)
    return _sdpa_any(q, k, v, scale, mask)


def _sdpa_any(q, k, v, scale, mask):
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
    gqa = q.shape[1] != k.shape[1]
    if mask is None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1, scale=scale, enable_gqa=gqa)
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return o.transpose(1, 2)  # (B, T, H, D)


BACKENDS: dict[str, type[AttentionBackend]] = {"torch": TorchBackend}
# Backends that need an optional package, imported only when chosen so that the engine imports
# without it: name -> "module:function" returning the class (or raising a one-line ImportError).
LAZY_BACKENDS: dict[str, str] = {"triton": "reference_engine.triton_attention:backend_class",
                                 "cpu": "reference_engine.cpu_attention:backend_class"}


def get_backend(name: str) -> type[AttentionBackend]:
    if name not in BACKENDS and name in LAZY_BACKENDS:
        module, func = LAZY_BACKENDS[name].split(":")
        BACKENDS[name] = getattr(importlib.import_module(module), func)()
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {', '.join({**BACKENDS, **LAZY_BACKENDS})}")
    return BACKENDS[name]
