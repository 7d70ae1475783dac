"""Prefix caching end to end: shared prefixes are computed once, greedy output is identical with
the cache on and off (three families, chunking, preemption), counters, salts, reset."""
from __future__ import annotations

import pytest

from reference_engine import LLM, SamplingParams
from tests.reference_engine.helpers import random_prompts

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
TIGHT = dict(max_num_batched_tokens=16, kv_cache_tokens=176, block_size=8)  # small chunks, forced preemption
KV = 4096


def shared_prefix_prompts(n=8, prefix_len=40, seed=21):
    """A common 'system prompt' and distinct questions, plus two exact repeats."""
    questions = random_prompts(8192, n, 3, 30, seed=seed)
    system = random_prompts(8192, 1, prefix_len, prefix_len + 1, seed=seed + 1)[0]
    ps = [system + q for q in questions]
    return ps + ps[:2]


def run(model_dir, prompts, params=GREEDY, **kw):
    llm = LLM(str(model_dir), **{"kv_cache_tokens": KV, **kw})
    outs = llm.generate(prompts, params)
    st = llm.engine.stats()
    assert st.kv_used_blocks == 0 and llm.engine.scheduler.stats().kv_free_blocks == st.kv_total_blocks  # every block back
    return [o.token_ids for o in outs], llm


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_greedy_output_identical_with_prefix_cache_on_and_off(family, make_tiny):
    model = make_tiny(family)
    prompts = shared_prefix_prompts()
    off, llm_off = run(model, prompts, enable_prefix_caching=False)
    assert llm_off.engine.stats().prefix_cache_queries == 0  # off: nothing looked up, nothing counted
    for kw in ({}, {"max_num_seqs": 3}, TIGHT):  # all admitted at once (no hits possible), staggered, tight
        on, llm = run(model, prompts, record_steps=True, **kw)
        assert on == off, kw
        st = llm.engine.stats()
        assert st.prefix_cache_queries >= sum(len(p) for p in prompts) and st.kv_cached_blocks > 0
        assert (st.prefix_cache_hits > 0) == bool(kw)  # blocks are cached once computed, not before
        recs = llm.engine.step_records
        assert sum(r.prefix_cache_hits for r in recs) == st.prefix_cache_hits
        assert sum(r.prefix_cache_queries for r in recs) == st.prefix_cache_queries
        if kw is TIGHT:
            assert st.num_preemptions_total > 0
            # preempted requests find (some of) their own blocks again when re-admitted
            preempted = {rid for r in recs for rid in r.preempted}
            assert any(r.prefix_hits.get(rid, 0) > 0 for r in recs for rid in preempted
                       if any(rid in q.preempted for q in recs if q.step < r.step))


def test_shared_prefix_is_computed_once_and_records_show_it(tiny_llama):
    prompts = shared_prefix_prompts(n=2)[:2]  # 40 shared tokens = 2 full blocks of 16
    llm = LLM(str(tiny_llama), kv_cache_tokens=KV, record_steps=True)
    llm.generate(prompts[:1], GREEDY)
    llm.generate(prompts[1:], GREEDY)
    first = llm.engine.step_records[0]
    admitted = next(r for r in llm.engine.step_records if "1" in r.prefix_hits)
    assert first.prefix_hits == {"0": 0} and admitted.prefix_hits == {"1": 32}
    assert admitted.prefix_hit_blocks["1"] == 2 and admitted.scheduled == [("1", len(prompts[1]) - 32, "prefill")]
    assert admitted.block_tables["1"][:2] == first.block_tables["0"][:2]  # the very same blocks
    assert admitted.kv_blocks_cached >= 2
    assert admitted.kv_blocks_used + admitted.kv_blocks_free == llm.engine.stats().kv_total_blocks
    st = llm.engine.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (len(prompts[0]) + len(prompts[1]), 32)


def test_a_conversation_reuses_its_own_generated_tokens(tiny_llama):
    llm = LLM(str(tiny_llama), kv_cache_tokens=KV, block_size=8)
    turn1 = random_prompts(8192, 1, 20, 21, seed=5)[0]
    [a] = llm.generate([turn1], GREEDY)
    turn2 = turn1 + a.token_ids + [100, 101, 102]
    before = llm.engine.stats().prefix_cache_hits
    llm.generate([turn2], GREEDY)
    # prompt + all but the last generated token have KV (the last one was sampled, never fed back)
    assert llm.engine.stats().prefix_cache_hits - before == (len(turn1) + len(a.token_ids) - 1) // 8 * 8


def test_cache_salt_isolates_requests(tiny_llama):
    llm = LLM(str(tiny_llama), kv_cache_tokens=KV)
    e, p = llm.engine, shared_prefix_prompts(n=1)[0]

    def hits(salt):
        before = e.stats().prefix_cache_hits
        e.add_request(p, GREEDY, cache_salt=salt)
        while e.has_unfinished():
            e.step()
        return e.stats().prefix_cache_hits - before

    assert hits(None) == 0 and hits(None) > 0
    assert hits("alice") == 0 and hits("alice") > 0 and hits("bob") == 0


def test_reset_prefix_cache(tiny_llama):
    llm = LLM(str(tiny_llama), kv_cache_tokens=KV)
    e, p = llm.engine, shared_prefix_prompts(n=1)[0]
    [ref] = llm.generate([p], GREEDY)
    assert e.stats().kv_cached_blocks > 0 and e.reset_prefix_cache() and e.stats().kv_cached_blocks == 0
    llm.generate([p], GREEDY)
    assert e.stats().prefix_cache_hits == 0  # nothing left to find after the reset
    rid = e.add_request(p, GREEDY)
    out = [t for d in e.step() for t in d.new_token_ids]
    assert e.reset_prefix_cache() is False  # a running request holds blocks: refused, as vLLM
    assert e.reset_prefix_cache(reset_running_requests=True) is True  # preempt it first
    assert e.stats().num_preemptions_total == 1 and e.stats().kv_used_blocks == 0
    while e.has_unfinished():
        out += [t for d in e.step() if d.request_id == rid for t in d.new_token_ids]
    assert out == ref.token_ids  # recomputed from scratch, same tokens
