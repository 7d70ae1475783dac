"""The engine end to end: token-exact with HF transformers, under chunking and preemption.
HF's greedy tokens are checked teacher-forced (helpers.hf_argmax_along: one HF forward per prompt
over our output, ~10x cheaper than HF's `generate`, which needs one per token)."""
from __future__ import annotations

import pytest

from reference_engine import LLM, SamplingParams
from tests.reference_engine.helpers import hf_argmax_along, random_prompts

GREEDY = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
N_PROMPTS = 16


def _check(llm: LLM, model_dir, prompts):
    outs = llm.generate(prompts, GREEDY)
    hf = hf_argmax_along(str(model_dir), prompts, [o.token_ids for o in outs])
    mismatched = [i for i, (o, r) in enumerate(zip(outs, hf)) if list(o.token_ids) != r]
    assert not mismatched, f"prompts {mismatched} differ from HF transformers"
    assert all(len(o.token_ids) == 64 and o.finish_reason == "length" for o in outs)
    stats = llm.engine.stats()
    assert stats.kv_used_blocks == 0 and stats.num_running == 0 and stats.num_waiting == 0
    return outs


@pytest.mark.slow
@pytest.mark.parametrize("family", ["tiny_llama", "tiny_qwen2", "tiny_qwen3"])
def test_batched_greedy_matches_hf(family, request):
    model_dir = request.getfixturevalue(family)
    llm = LLM(str(model_dir))
    prompts = random_prompts(llm.engine.model_config.vocab_size, N_PROMPTS)
    _check(llm, model_dir, prompts)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["tiny_llama", "tiny_qwen2", "tiny_qwen3"])
def test_small_prefill_chunks_and_preemption_match_hf(family, request):
    """16-token chunks and a KV cache too small for the batch: same tokens, and preemption did happen."""
    model_dir = request.getfixturevalue(family)
    # 16 requests of up to ~163 tokens need ~1700 tokens of KV; give 640 so that the scheduler must preempt.
    llm = LLM(str(model_dir), max_num_batched_tokens=16, kv_cache_tokens=640, block_size=8, record_steps=True)
    prompts = random_prompts(llm.engine.model_config.vocab_size, N_PROMPTS)
    _check(llm, model_dir, prompts)
    assert llm.engine.scheduler.num_preemptions > 0
    records = llm.engine.step_records
    assert max(r.num_prefill_tokens + r.num_decode_tokens for r in records) <= 16
    assert any(r.preempted for r in records)


def test_text_prompts_and_eos_stop(tiny_llama):
    llm = LLM(str(tiny_llama))
    tok = llm.tokenizer
    [out] = llm.generate(["The quick brown fox"], SamplingParams(max_tokens=8, temperature=0.0))
    assert out.prompt_token_ids == tok.encode("The quick brown fox")
    assert out.text == tok.decode(out.token_ids)
    assert 1 <= len(out.token_ids) <= 8


def test_stop_token_ids_and_stop_strings(tiny_llama):
    llm = LLM(str(tiny_llama))
    prompt = random_prompts(llm.engine.model_config.vocab_size, 1, 20, 21, seed=3)[0]
    [free] = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    # stop at the 5th generated token's id
    stop_id = free.token_ids[4]
    first = free.token_ids.index(stop_id)
    [a] = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                                                stop_token_ids=[stop_id]))
    assert a.token_ids == free.token_ids[: first + 1]
    assert a.finish_reason == "stop" and a.stop_reason == stop_id
    # stop string: a piece of the free-running text; the output text ends right before it
    needle = next(free.text[i:i + 3] for i in range(len(free.text) // 2, len(free.text) - 2)
                  if free.text[i:i + 3].strip())
    [b] = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[needle]))
    assert b.finish_reason == "stop" and b.stop_reason == needle
    assert b.text == free.text[: free.text.index(needle)]
    assert len(b.token_ids) < len(free.token_ids)


def test_max_model_len_caps_generation(make_tiny):
    model_dir = make_tiny("llama", seed=0)
    llm = LLM(str(model_dir), max_model_len=40)
    prompt = random_prompts(llm.engine.model_config.vocab_size, 1, 30, 31)[0]
    [out] = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 10 and out.finish_reason == "length"
    with pytest.raises(ValueError, match="context length"):
        llm.generate([prompt], SamplingParams(max_tokens=11, temperature=0.0))


def test_logprobs_are_top_n_of_raw_logits(tiny_llama):
    llm = LLM(str(tiny_llama))
    [out] = llm.generate([[10, 11, 12]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=3))
    assert len(out.logprobs) == 4
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == tok
        assert len(lp.top) == 3
        best = max(lp.top, key=lp.top.get)
        assert best == tok and lp.top[best] == pytest.approx(lp.logprob)  # greedy picks the top-1
        assert all(v <= 0 for v in lp.top.values())
