"""Attention over the paged KV cache, behind a small backend interface.

A backend does two things per layer: write this step's keys/values into their cache
slots, and attend each query token to its sequence's context. The model never sees
block tables; the runner builds `AttentionMetadata` once per step and every layer
reuses it. Backends are registered by name in `registry.py`.

Batch layout invariant (the runner guarantees it): the first `num_decodes` sequences
have exactly one query token each; prefill (or chunked-prefill) sequences follow.

A backend that can be captured in a CUDA graph (`graph_safe`) reads only device tensors and the
`max_*` / `num_splits` bounds, never the Python lists, and accepts padding: sequences with zero
query tokens and zero context, tokens with slot -1 (written nowhere), their output rows unset.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

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
