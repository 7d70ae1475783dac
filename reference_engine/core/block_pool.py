"""The block pool of the paged KV cache: fixed-size blocks handed out to requests on demand.

Token `t` of a request lives in block `block_table[t // block_size]` at offset
`t % block_size`; its flat slot is `block * block_size + offset`. The tensors those ids index
(per layer, K and V shaped `(num_blocks, block_size, Hkv, D)`) are the runner's: they are sized
and allocated in `worker/kv_cache.py` (sized by `worker/memory_plan.py`), and this module knows nothing of them.

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
