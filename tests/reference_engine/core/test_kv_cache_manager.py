"""The KV-cache manager on synthetic requests (no model): hash chains, sharing and reference
counts, eviction order, rollback of rejected draft slots, reset."""
from __future__ import annotations

from reference_engine.core.kv_cache_manager import KVCacheManager
from reference_engine.core.prefix_cache import ROOT, block_hashes, hash_block
from reference_engine.core.request import Request
from reference_engine.sampling_params import SamplingParams

BS = 4


def _req(rid, tokens, salt=None):
    return Request(rid, list(tokens), SamplingParams(max_tokens=8), cache_salt=salt)


def _admit(kv: KVCacheManager, req: Request) -> int:
    """Admit with prefix lookup, 'compute' the whole prompt, index its full blocks. -> tokens hit."""
    hit, n = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - n, hit)
    req.num_computed_tokens = req.num_tokens
    kv.cache_full_blocks(req)
    return n


def test_hash_chain_covers_the_whole_prefix_and_the_salt():
    a = block_hashes(_req("a", range(12)), 3, BS)
    assert a == block_hashes(_req("a2", range(12)), 3, BS)  # same content, same hashes
    assert a[0] == hash_block(ROOT, [0, 1, 2, 3]) and a[1] == hash_block(a[0], [4, 5, 6, 7])
    b = block_hashes(_req("b", [99] + list(range(1, 12))), 3, BS)  # first token differs
    assert all(x != y for x, y in zip(a, b))  # ... so every later block's hash differs too
    assert hash_block(ROOT, [4, 5, 6, 7]) != a[1]  # a block's hash depends on its parent
    salted = block_hashes(_req("s", range(12), salt="tenant-1"), 3, BS)
    assert all(x != y for x, y in zip(a, salted))
    assert salted == block_hashes(_req("s2", range(12), salt="tenant-1"), 3, BS)
    r = _req("lazy", range(12))
    block_hashes(r, 1, BS)
    assert len(r.block_hashes) == 1  # hashed lazily, each block once
    assert block_hashes(r, 3, BS)[:1] == a[:1] and len(r.block_hashes) == 3


def test_sharing_counts_references_and_always_recomputes_the_last_token():
    kv = KVCacheManager(16, BS)
    a = _req("a", range(12))  # 3 full blocks
    assert _admit(kv, a) == 0 and kv.num_cached == 3
    b = _req("b", range(12))  # identical prompt: the last token must be recomputed -> 2 blocks hit
    assert _admit(kv, b) == 8
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [kv.pool.ref_count[x] for x in a.block_table] == [2, 2, 1]
    c = _req("c", list(range(8)) + [50, 51, 52, 53, 54])  # shares two blocks, then diverges
    assert _admit(kv, c) == 8 and [kv.pool.ref_count[x] for x in a.block_table[:2]] == [3, 3]
    assert (kv.queries, kv.hits) == (12 + 12 + 13, 0 + 8 + 8)
    kv.free(a)
    assert [kv.pool.ref_count[x] for x in b.block_table[:2]] == [2, 2]
    assert kv.num_used == 2 + 1 + 2  # the shared pair, b's third block, c's own two
    kv.free(b)
    kv.free(c)
    assert kv.num_used == 0 and kv.num_free == 16  # every block back: free, some still cached
    assert kv.num_cached == 4  # a's 3 blocks + c's third block (b's third duplicated a's: not indexed)
    d = _req("d", range(13))
    assert _admit(kv, d) == 12  # found after everyone left: freed blocks stay cached


def test_eviction_is_lazy_least_recently_freed_first_tail_first_and_uncached_first():
    kv = KVCacheManager(8, BS)
    a, b = _req("a", range(100, 109)), _req("b", range(200, 209))  # 2 full blocks + 1 partial each
    _admit(kv, a)
    _admit(kv, b)
    a_full, b_full = a.block_table[:2], b.block_table[:2]
    kv.free(a)  # freed first: evicted first
    kv.free(b)
    # 2 never-used blocks, then the partial (uncached) blocks, then a's tail, a's head, b's tail, b's head
    order = list(kv.pool.free_ids)
    assert order[-4:] == [a_full[1], a_full[0], b_full[1], b_full[0]]
    assert set(order[:4]) == set(range(8)) - set(a_full) - set(b_full)  # never used, or held nothing cached
    x = _req("x", range(300, 304 + 4 * 4))  # 5 blocks: the 4 uncached ones, then a's tail block
    assert kv.allocate_slots(x, x.num_tokens, [])
    assert a_full[1] in x.block_table and a_full[0] not in x.block_table
    assert kv.get_computed_blocks(_req("a2", range(100, 109)))[1] == 4  # a's head survives, its tail is gone
    assert kv.get_computed_blocks(_req("b2", range(200, 209)))[1] == 8  # b untouched


def test_uncached_free_blocks_are_handed_out_before_cached_ones():
    kv = KVCacheManager(3, BS)
    a = _req("a", range(8))
    _admit(kv, a)  # 2 full cached blocks
    p = _req("p", range(50, 53))  # a partial block: never cached
    _admit(kv, p)
    p_block = p.block_table[0]
    kv.free(a)
    kv.free(p)
    q = _req("q", range(70, 73))
    assert kv.allocate_slots(q, 3, []) and q.block_table == [p_block]
    assert kv.num_cached == 2  # it got the block that held nothing cached: a's blocks were not evicted


def test_allocation_is_all_or_nothing_and_cached_free_blocks_count_against_the_pool():
    kv = KVCacheManager(4, BS)
    a = _req("a", range(8))
    _admit(kv, a)
    kv.free(a)
    big = _req("big", range(8))
    hit, n = kv.get_computed_blocks(big)
    assert n == 4  # one full block hit (the last token is recomputed)
    x = _req("x", range(500, 512))
    assert kv.allocate_slots(x, 12, [])  # 3 blocks: the 2 never used, then a's tail (evicted)
    assert kv.num_free == 1 and kv.pool.free_ids.get(hit[0], 0) is None  # only the hit block is free
    before = (list(kv.pool.free_ids), list(big.block_table))
    assert not kv.allocate_slots(big, 4, hit)  # reviving it + 1 new block > 1 free: refused, nothing changed
    assert (list(kv.pool.free_ids), big.block_table) == before and kv.queries == 8 + 12


def test_rollback_uncounts_rejected_slots_frees_their_block_and_never_caches_them():
    kv = KVCacheManager(8, BS)
    r = _req("r", range(7))  # 7 tokens: 1 full block + 3
    _admit(kv, r)
    r.output_token_ids.append(7)  # sampled: 8 tokens, 7 computed
    # next step: the sampled token + 3 drafts -> slots 7..10 -> a third block
    assert kv.allocate_slots(r, 1 + 3)
    assert len(r.block_table) == 3
    third = r.block_table[2]
    r.num_computed_tokens += 4
    r.output_token_ids.append(42)  # all 3 drafts rejected: the target's own token is appended
    kv.rollback(r, 3)
    assert r.num_computed_tokens == 8 and r.num_tokens == 9
    assert len(r.block_table) == 3  # slot 8 (the new token) still needs the third block
    kv.cache_full_blocks(r)
    assert kv.num_cached == 2  # blocks 0 and 1 (tokens 0..7, all computed and accepted)
    # 2 rejected of 2 drafts: the new token fits block 1 -> the third block held only drafts
    s = _req("s", range(100, 106))
    _admit(kv, s)
    s.output_token_ids.append(1)
    assert kv.allocate_slots(s, 1 + 2) and len(s.block_table) == 3
    s.num_computed_tokens += 3
    s.output_token_ids.append(2)
    used, drafts_only = kv.num_used, s.block_table[2]
    kv.rollback(s, 2)
    assert (s.num_computed_tokens, s.num_tokens, len(s.block_table)) == (7, 8, 2)
    assert kv.num_used == used - 1 and kv.pool.ref_count[drafts_only] == 0
    assert next(iter(kv.pool.free_ids)) == drafts_only and kv.pool.ref_count[third] == 1
    kv.cache_full_blocks(s)
    assert not kv.cache.is_cached(s.block_table[1])  # token 7 is not computed: block 1 not indexed
    assert s.block_hashes == [hash_block(ROOT, list(range(100, 104)))]  # drafts were never hashed


def test_lookahead_slots_and_reset():
    kv = KVCacheManager(8, BS)
    r = _req("r", range(6))
    hit, _ = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, 6, hit, lookahead=3) and len(r.block_table) == 3  # 9 slots
    r.num_computed_tokens = 6
    kv.cache_full_blocks(r)
    assert not kv.reset_prefix_cache()  # blocks held: refused, as vLLM
    kv.free(r)
    assert kv.num_cached == 1 and kv.reset_prefix_cache() and kv.num_cached == 0
    assert kv.get_computed_blocks(_req("r2", range(6))) == ([], 0)


def test_caching_off_finds_and_counts_nothing():
    kv = KVCacheManager(8, BS, enable_prefix_caching=False)
    a, b = _req("a", range(9)), _req("b", range(9))
    _admit(kv, a)
    assert _admit(kv, b) == 0 and kv.num_cached == 0 and (kv.queries, kv.hits) == (0, 0)
    assert a.block_hashes == []  # nothing hashed either
