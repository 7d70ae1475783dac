"""Speculative decoding end to end: greedy output identical with it off (n-gram and draft model,
three families, under chunking and preemption), stops inside an accepted run, counters, seeds."""
from __future__ import annotations

import json
import shutil

import pytest

from reference_engine import LLM, EngineConfig, SamplingParams
from reference_engine.spec_decode.ngram import find_ngram
from tests.reference_engine.helpers import random_prompts

GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
TIGHT = dict(max_num_batched_tokens=16, kv_cache_tokens=176, block_size=8)  # small chunks, forced preemption
KV = 4096  # tokens: enough for these tests, and quick to allocate (the default is 512 MiB per model)


def draft(model_dir, k=3):
    return {"method": "draft_model", "model": str(model_dir), "num_speculative_tokens": k}


def prompts_for(n=8, vocab=8192):
    """Half random, half repetitive (so that n-gram lookup finds something). The tiny preset's vocabulary."""
    rand = random_prompts(vocab, n, 2, 60, seed=11)
    return rand[: n // 2] + [(p[:7] * 6)[: len(p)] for p in rand[n // 2:]]


def run(model_dir, prompts, params=GREEDY, **kw):
    llm = LLM(str(model_dir), **{"kv_cache_tokens": KV, **kw})
    outs = llm.generate(prompts, params)
    st = llm.engine.stats()
    assert st.kv_used_blocks == 0 and st.num_running == 0 and st.num_waiting == 0  # every block back
    assert llm.engine.scheduler.stats().kv_free_blocks == st.kv_total_blocks
    return [o.token_ids for o in outs], llm


def check_counters(llm) -> None:
    st = llm.engine.stats()
    per_pos = st.spec_decode_num_accepted_tokens_per_pos
    assert sum(per_pos) == st.spec_decode_num_accepted_tokens <= st.spec_decode_num_draft_tokens
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))  # position j+1 is only reached through j
    assert st.spec_decode_num_drafts <= st.spec_decode_num_draft_tokens <= 3 * st.spec_decode_num_drafts


def test_find_ngram_prefers_the_longest_suffix_match():
    assert find_ngram([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]  # [2, 3] matched at index 1
    assert find_ngram([1, 2, 3, 9, 2, 3, 7, 1, 2, 3], 1, 3, 2) == [9, 2]  # longest (3) wins, first occurrence
    assert find_ngram([5, 6, 7], 1, 2, 3) == []
    assert find_ngram([5, 5], 1, 1, 3) == [5]  # what follows the match, up to the end
    assert find_ngram([1], 1, 3, 3) == []


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_greedy_output_identical_with_speculation(family, make_tiny):
    target = make_tiny(family)
    other = make_tiny(family, seed=1, num_hidden_layers=1)  # a different, weaker draft: many rejections
    prompts = prompts_for()
    base, _ = run(target, prompts, enable_prefix_caching=False)
    for spec, kw in [(NGRAM, {}), (draft(target), {}), (draft(other), {}),
                     (NGRAM, TIGHT), (draft(target), TIGHT), (draft(other, k=2), TIGHT)]:
        outs, llm = run(target, prompts, speculative_config=spec, record_steps=True, **kw)
        assert outs == base, f"{spec} {kw}"
        check_counters(llm)
        st = llm.engine.stats()
        assert st.spec_decode_num_drafts > 0 and st.generation_tokens_total == len(prompts) * GREEDY.max_tokens
        if spec["method"] == "draft_model" and spec["model"] == str(target):
            assert st.spec_decode_num_accepted_tokens == st.spec_decode_num_draft_tokens  # the same model agrees
        if kw:
            assert st.num_preemptions_total > 0
            assert max(r.num_prefill_tokens + r.num_decode_tokens + r.num_verify_tokens
                       for r in llm.engine.step_records) <= 16


def test_step_records_show_proposed_and_accepted_tokens(tiny_llama):
    _, llm = run(tiny_llama, [[10, 11, 12] * 5], speculative_config=draft(tiny_llama), record_steps=True)
    recs = llm.engine.step_records
    spec_steps = [r for r in recs if r.spec_proposed]
    assert spec_steps
    for r in spec_steps:
        for rid, k in r.spec_proposed.items():
            assert r.spec_accepted[rid] <= k and r.new_tokens[rid] == r.spec_accepted[rid] + 1
            assert [kind for i, n, kind in r.scheduled if i == rid] == ["verify"]  # not "decode": it runs the prefill path
            assert [n for i, n, _ in r.scheduled if i == rid] == [k + 1]
    assert sum(sum(r.new_tokens.values()) for r in recs) == GREEDY.max_tokens
    assert len(recs) < GREEDY.max_tokens // 2  # the same model as draft: ~k+1 tokens per step


def test_stops_inside_an_accepted_run_truncate_it(tiny_llama):
    spec = dict(speculative_config=draft(tiny_llama))
    prompt = random_prompts(8192, 1, 20, 21, seed=3)[0]
    plain = LLM(str(tiny_llama), kv_cache_tokens=KV)
    free = plain.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))[0]
    llm = LLM(str(tiny_llama), kv_cache_tokens=KV, **spec)
    stop_id = free.token_ids[5]
    first = free.token_ids.index(stop_id)
    [a] = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                                                stop_token_ids=[stop_id]))
    assert a.token_ids == free.token_ids[: first + 1] and (a.finish_reason, a.stop_reason) == ("stop", stop_id)
    needle = next(free.text[i:i + 3] for i in range(len(free.text) // 2, len(free.text) - 2)
                  if free.text[i:i + 3].strip())
    [b] = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[needle]))
    assert b.text == free.text[: free.text.index(needle)] and b.finish_reason == "stop"
    ref = plain.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[needle]))[0]
    assert b.token_ids == ref.token_ids  # the same tokens as one-per-step decoding, not the whole run
    for m in (1, 2, 5, 7):  # max_tokens that no multiple of k + 1 hits
        [c] = llm.generate([prompt], SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
        assert c.token_ids == free.token_ids[:m] and c.finish_reason == "length"
    assert llm.engine.stats().generation_tokens_total == len(a.token_ids) + len(b.token_ids) + 1 + 2 + 5 + 7
    assert llm.engine.stats().kv_used_blocks == 0


def test_logprobs_with_speculation_equal_without(tiny_llama):
    p = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)
    [a] = LLM(str(tiny_llama), kv_cache_tokens=KV).generate([[10, 11, 12] * 4], p)
    [b] = LLM(str(tiny_llama), kv_cache_tokens=KV, speculative_config=draft(tiny_llama)).generate(
        [[10, 11, 12] * 4], p)
    assert b.token_ids == a.token_ids and len(b.logprobs) == 12
    for x, y in zip(a.logprobs, b.logprobs):
        assert x.token_id == y.token_id and x.logprob == pytest.approx(y.logprob, abs=1e-4)
        assert list(x.top) == list(y.top)


def test_sampling_uses_the_draft_distribution_and_seeds_stay_reproducible(tiny_llama, make_tiny):
    # The target as its own draft: q == p, so every draft is accepted (up to float rounding). A draft
    # probability taken from the wrong row or the wrong request would show up as rejections.
    llm = LLM(str(tiny_llama), kv_cache_tokens=KV, speculative_config=draft(tiny_llama))
    prompts = random_prompts(8192, 4, 5, 30, seed=4)
    llm.generate(prompts, SamplingParams(max_tokens=24, temperature=1.0, top_k=50, ignore_eos=True))
    st = llm.engine.stats()
    assert st.spec_decode_num_accepted_tokens >= 0.95 * st.spec_decode_num_draft_tokens > 0
    # A weak draft (many rejections): a seeded request gives the same tokens alone, twice, and batched.
    weak_draft = make_tiny("llama", seed=1, num_hidden_layers=1)
    weak = LLM(str(tiny_llama), kv_cache_tokens=KV, speculative_config=draft(weak_draft))
    seeded = SamplingParams(max_tokens=24, temperature=1.0, seed=123, ignore_eos=True)
    other = SamplingParams(max_tokens=24, temperature=0.8, ignore_eos=True)
    alone = weak.generate([prompts[0]], seeded)[0].token_ids
    assert weak.generate([prompts[0]], seeded)[0].token_ids == alone
    batched = weak.generate([prompts[1], prompts[0], prompts[2]], [other, seeded, other])
    assert batched[1].token_ids == alone
    assert weak.generate([prompts[0]], SamplingParams(max_tokens=24, temperature=1.0, seed=124,
                                                      ignore_eos=True))[0].token_ids != alone


def test_speculative_config_is_validated(tiny_llama, tmp_path):
    for bad, match in [({"method": "eagle", "num_speculative_tokens": 2}, "method"),
                       ({"method": "ngram"}, "num_speculative_tokens"),
                       ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
                         "prompt_lookup_max": 2}, "prompt_lookup"),
                       ({"method": "draft_model", "num_speculative_tokens": 2}, "model"),
                       ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}, "unknown keys")]:
        with pytest.raises(ValueError, match=match):
            EngineConfig(str(tiny_llama), speculative_config=bad)
    spec = EngineConfig(str(tiny_llama), speculative_config={"model": "d", "num_speculative_tokens": 2}).speculative
    assert spec.method == "draft_model"  # inferred from `model`, as vLLM does
    ngram = EngineConfig(str(tiny_llama), speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                                              "prompt_lookup_max": 4}).speculative
    assert (ngram.prompt_lookup_min, ngram.prompt_lookup_max) == (4, 4)
    wrong_vocab = tmp_path / "draft"
    shutil.copytree(tiny_llama, wrong_vocab)
    cfg = json.loads((wrong_vocab / "config.json").read_text())
    (wrong_vocab / "config.json").write_text(json.dumps({**cfg, "vocab_size": 4096}))
    with pytest.raises(ValueError, match="vocab_size"):
        LLM(str(tiny_llama), speculative_config=draft(wrong_vocab))


def test_draft_kv_shares_the_block_budget(tiny_llama):
    """The draft's KV lives in the same block ids: a byte budget buys fewer blocks with it."""
    budget = 4 << 20
    plain = LLM(str(tiny_llama), kv_cache_bytes=budget).engine.stats().kv_total_blocks
    with_draft = LLM(str(tiny_llama), kv_cache_bytes=budget, speculative_config=draft(tiny_llama)).engine
    assert with_draft.stats().kv_total_blocks == plain // 2  # the same model twice: half the blocks
    assert len(with_draft.runner.proposer.kv_cache) == with_draft.model_config.num_layers


def test_min_tokens_with_speculation_equals_without(tiny_llama):
    """min_tokens bans the stop ids per position: with drafts, row j counts the j drafts before it."""
    prompt = random_prompts(8192, 1, 20, 21, seed=3)[0]
    plain = LLM(str(tiny_llama), kv_cache_tokens=KV)
    free = plain.generate([prompt], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))[0].token_ids
    # the first position m >= 4 whose token is new: banned until m, it is drawn exactly at m
    m = next(m for m in range(4, 15) if free[m] not in free[:m])
    params = SamplingParams(max_tokens=16, temperature=0.0, min_tokens=m, stop_token_ids=[free[m]])
    [ref] = plain.generate([prompt], params)
    assert ref.token_ids == free[:m + 1] and ref.stop_reason == free[m]
    for spec in (draft(tiny_llama), NGRAM):
        [got] = LLM(str(tiny_llama), kv_cache_tokens=KV, speculative_config=spec).generate([prompt], params)
        assert (got.token_ids, got.text, got.finish_reason, got.stop_reason) == \
            (ref.token_ids, ref.text, ref.finish_reason, ref.stop_reason)
