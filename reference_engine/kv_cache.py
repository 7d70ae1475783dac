"""The paged KV cache: fixed-size blocks in one pool, handed out to requests on demand.

Memory: per layer, a key and a value tensor shaped `(num_blocks, block_size, Hkv, D)`.
Token `t` of a request lives in block `block_table[t // block_size]` at offset
`t % block_size`; its flat slot is `block * block_size + offset`.

The pool only counts references and keeps the free blocks in eviction order; what a
block holds (its prefix-cache hash) is the KV-cache manager's business
(`kv_cache_manager.py`), which is the only caller.

Invariants:
- a block is either free (in `free_ids`, ref_count 0) or held (ref_count >= 1), never both;
- `free_ids` is ordered: the head is handed out (and, if cached, evicted) first;
- `allocate` / `touch` / `free` are O(1) per block (an insertion-ordered dict as a queue);
- `num_free + num_used == num_blocks` at all times.
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from reference_engine.config import DEFAULT_KV_BYTES, EngineConfig, ModelConfig


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1:
            raise ValueError(f"the KV cache must hold at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_count = [0] * num_blocks
        # An OrderedDict is a queue with O(1) removal from the middle (a cache hit on a free block).
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_ids)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self.free_ids)

    def allocate(self, n: int) -> list[int]:
        """Take `n` blocks from the head of the free queue (ref_count 1 each)."""
        if n > len(self.free_ids):
            raise RuntimeError(f"out of KV blocks: want {n}, have {len(self.free_ids)}")
        ids = [self.free_ids.popitem(last=False)[0] for _ in range(n)]
        for b in ids:
            self.ref_count[b] = 1
        return ids

    def touch(self, ids: list[int]) -> None:
        """Take one more reference to each block (a prefix-cache hit); a free block leaves the queue."""
        for b in ids:
            if self.ref_count[b] == 0:
                del self.free_ids[b]
            self.ref_count[b] += 1

    def free(self, ids: list[int], front: bool = False) -> None:
        """Drop one reference to each block; blocks reaching 0 join the free queue in the order given,
        at its tail (evicted last) or, with `front`, at its head (handed out first)."""
        for b in ids:
            self.ref_count[b] -= 1
            assert self.ref_count[b] >= 0, f"block {b} freed twice"
            if self.ref_count[b] == 0:
                self.free_ids[b] = None
                if front:
                    self.free_ids.move_to_end(b, last=False)


def blocks_needed(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def bytes_per_token(model: ModelConfig, dtype: torch.dtype) -> int:
    """K and V, every layer, one token."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * elem


def capacity_blocks(cfg: EngineConfig, model: ModelConfig, dtype: torch.dtype, max_model_len: int,
                    extra_bytes_per_token: int = 0) -> int:
    """Blocks from the budget given in tokens or bytes (default: DEFAULT_KV_BYTES, capped).
    `extra_bytes_per_token`: a draft model's KV, which lives in the same block ids."""
    per_tok = bytes_per_token(model, dtype) + extra_bytes_per_token
    if cfg.kv_cache_tokens is not None:
        tokens = cfg.kv_cache_tokens
    elif cfg.kv_cache_bytes is not None:
        tokens = cfg.kv_cache_bytes // per_tok
    else:
        tokens = min(DEFAULT_KV_BYTES // per_tok, cfg.max_num_seqs * max_model_len)
    return tokens // cfg.block_size


def allocate_kv_cache(model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: str | torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (num_blocks, block_size, model.num_kv_heads, model.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(model.num_layers)]
