"""The KV-cache manager: every change to a request's blocks goes through here.

The scheduler builds and owns it (`Scheduler.__init__`); nobody else holds it, and the model runner
only reads the block tables it writes, through the scheduler's per-step record. It puts the
block pool (`block_pool.py`: reference counts, free queue in eviction order) together with the
prefix cache (`prefix_cache.py`: content hash -> block), following vLLM v1's KVCacheManager:

    get_computed_blocks(req)          longest cached prefix (admission); takes no reference
    allocate_slots(req, n, ...)       blocks for n more tokens (+ lookahead); all or nothing
    cache_full_blocks(req)            index blocks that became full and computed
    rollback(req, n)                  un-count the slots of n rejected draft tokens
    free(req)                         drop the request's references (blocks stay cached)

Invariants:
- `req.block_table` covers `num_computed_tokens + scheduled tokens (+ lookahead)` after a
  successful `allocate_slots`, and nothing past `num_tokens` after `rollback`;
- a block is indexed in the prefix cache only when all its tokens are computed and are the
  request's own tokens (never draft tokens: `num_computed_tokens` never counts rejected slots);
- blocks shared through the cache are full and never written again (the last prompt token
  is always recomputed, so a hit never covers the block a request writes next);
- free blocks stay indexed until handed out again: eviction is lazy, least recently freed
  first; blocks with nothing cached are handed out before any cached one.
"""
from __future__ import annotations

from reference_engine.core.block_pool import BlockPool, blocks_needed
from reference_engine.core.prefix_cache import PREFIX_CACHES, PrefixCache, block_hashes
from reference_engine.core.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.pool = BlockPool(num_blocks, block_size)
        self.block_size = block_size
        self.enable_caching = enable_prefix_caching
        self.cache: PrefixCache = PREFIX_CACHES["hash" if enable_prefix_caching else "none"]()
        self.num_cached_blocks: dict[str, int] = {}  # per request: leading blocks already indexed (or hit)
        self.queries = 0  # tokens looked up at admission (vLLM: prefix_cache_queries)
        self.hits = 0  # of which found cached (vLLM: prefix_cache_hits)

    # ---- facts ----------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free(self) -> int:
        """Blocks nobody holds, cached or not (cached ones are evictable)."""
        return self.pool.num_free

    @property
    def num_used(self) -> int:
        return self.pool.num_used

    @property
    def num_cached(self) -> int:
        """Blocks indexed in the prefix cache, held or free."""
        return self.cache.num_cached

    # ---- the five verbs -------------------------------------------------------------
    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """Cached blocks for the request's leading full blocks, and how many tokens they hold.
        The last token is always left out: its logits are needed, so it must be computed."""
        if not self.enable_caching:
            return [], 0
        n = (req.num_tokens - 1) // self.block_size
        blocks = self.cache.lookup(block_hashes(req, n, self.block_size)[:n])
        return blocks, len(blocks) * self.block_size

    def allocate_slots(self, req: Request, num_new_tokens: int, computed_blocks: list[int] | None = None,
                       lookahead: int = 0) -> bool:
        """Blocks for `num_new_tokens` more tokens plus `lookahead` slots (a draft model writes its
        proposals' KV there). On admission pass `computed_blocks` (a list, maybe empty): they start
        the block table and the lookup counts as a prefix-cache query. False, changing nothing, if
        the pool is short."""
        bs = self.block_size
        hit = computed_blocks or []
        num_computed = req.num_computed_tokens + len(hit) * bs
        need = blocks_needed(num_computed + num_new_tokens + lookahead, bs) - len(req.block_table) - len(hit)
        revived = sum(1 for b in hit if self.pool.ref_count[b] == 0)  # free but cached: they leave the queue
        if max(need, 0) + revived > self.pool.num_free:
            return False
        if hit:
            self.pool.touch(hit)
            req.block_table = req.block_table + hit
            self.num_cached_blocks[req.request_id] = len(hit)
        if computed_blocks is not None and self.enable_caching:
            self.queries += req.num_tokens
            self.hits += len(hit) * bs
        if need > 0:
            new = self.pool.allocate(need)
            for b in new:
                self.cache.evict(b)  # lazy eviction: whatever the block held is overwritten from now on
            req.block_table += new
        return True

    def cache_full_blocks(self, req: Request) -> None:
        """Index the request's blocks that became full of computed tokens since the last call. O(1)
        unless a block filled up; each block is hashed once."""
        if not self.enable_caching:
            return
        full = min(req.num_computed_tokens, req.num_tokens) // self.block_size
        start = self.num_cached_blocks.get(req.request_id, 0)
        if full <= start:
            return
        hs = block_hashes(req, full, self.block_size)
        for i in range(start, full):
            self.cache.insert(hs[i], req.block_table[i])
        self.num_cached_blocks[req.request_id] = full

    def rollback(self, req: Request, num_rejected: int) -> None:
        """Un-count the slots of rejected draft tokens (their KV is garbage, overwritten later) and
        free blocks past the request's tokens (they held only drafts or lookahead)."""
        req.num_computed_tokens = min(req.num_computed_tokens - num_rejected, req.num_tokens)
        keep = blocks_needed(req.num_tokens, self.block_size)
        if len(req.block_table) > keep:
            tail = req.block_table[keep:]
            req.block_table = req.block_table[:keep]
            self.pool.free(tail[::-1], front=True)  # nothing cached in them: hand them out first

    def free(self, req: Request) -> None:
        """Drop the request's references. Blocks are released tail first, so that under eviction a
        shared prefix outlives the suffixes that extend it; uncached blocks go first of all."""
        table = req.block_table[::-1]
        self.pool.free([b for b in table if not self.cache.is_cached(b)], front=True)
        self.pool.free([b for b in table if self.cache.is_cached(b)])
        req.block_table = []
        self.num_cached_blocks.pop(req.request_id, None)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block. As in vLLM, this fails (False) while any block is held."""
        if self.pool.num_used:
            return False
        self.cache.reset()
        return True
