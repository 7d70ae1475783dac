"""Batch invariance (issue 21): a request's distribution and a seeded request's tokens do not depend
on which requests share its batch: mixed greedy, top-p, top-k, min-p, penalties and min_tokens rows,
at any position. Property tests (hypothesis) at two levels: the sampler's distributions bit for bit,
and the engine's seeded tokens end to end."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_engine import LLM, SamplingParams
from reference_engine.worker.sampler import make_batch, process

VOCAB = 512

params_st = st.builds(
    SamplingParams,
    max_tokens=st.just(6),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.3]),
    top_p=st.sampled_from([1.0, 1.0, 0.3, 0.9]),
    top_k=st.sampled_from([-1, -1, 1, 5, 40]),
    min_p=st.sampled_from([0.0, 0.0, 0.05, 0.3]),
    repetition_penalty=st.sampled_from([1.0, 1.0, 1.3]),
    presence_penalty=st.sampled_from([0.0, 0.0, 0.7]),
    frequency_penalty=st.sampled_from([0.0, 0.0, -0.4]),
    min_tokens=st.sampled_from([0, 0, 3]),
    stop_token_ids=st.sampled_from([[], [9, 10]]),
    seed=st.one_of(st.none(), st.integers(0, 2**31)),
    ignore_eos=st.just(True),
)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(params_st, min_size=2, max_size=8), data=st.data())
def test_each_rows_distribution_is_the_same_alone_and_batched(rows, data):
    n = len(rows)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 1000)))
    logits = torch.randn(n, VOCAB, generator=g) * data.draw(st.sampled_from([1.0, 4.0]))
    prompts = [torch.randint(VOCAB, (5,), generator=g).tolist() for _ in rows]
    outputs = [torch.randint(VOCAB, (data.draw(st.integers(0, 4)),), generator=g).tolist() for _ in rows]
    stops = [[1, *p.stop_token_ids] for p in rows]
    x, greedy = process(logits, make_batch(rows, prompts, outputs, [None] * n, "cpu", stops))
    for j in range(n):
        xj, gj = process(logits[j:j + 1], make_batch(rows[j:j + 1], prompts[j:j + 1], outputs[j:j + 1], [None],
                                                     "cpu", stops[j:j + 1]))
        assert int(greedy[j]) == int(gj[0])
        if not rows[j].greedy:
            assert torch.equal(x[j].softmax(-1), xj[0].softmax(-1)), rows[j]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama))


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=params_st.filter(lambda p: not p.greedy), others=st.lists(params_st, min_size=1, max_size=5),
       where=st.integers(0, 5), seed=st.integers(0, 2**31))
def test_a_seeded_request_gives_the_same_tokens_alone_and_in_any_batch(llm, target, others, where, seed):
    target.seed = seed
    vocab = llm.engine.model_config.vocab_size
    g = torch.Generator().manual_seed(seed % 1000)
    prompts = [torch.randint(8, vocab, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist()
               for _ in range(len(others) + 1)]
    [alone] = llm.generate([prompts[0]], target)
    where = min(where, len(others))
    batch_params = others[:where] + [target] + others[where:]
    batch_prompts = prompts[1:where + 1] + [prompts[0]] + prompts[where + 1:]
    batched = llm.generate(batch_prompts, batch_params)
    assert batched[where].token_ids == alone.token_ids


def test_greedy_logprobs_have_the_same_bits_alone_and_batched(tiny_llama):
    """With one weight layout (every row count on the same k-ordered panel GEMM), a sequence's logits do not
    depend on its batch: each prompt prefilled in one piece, alone or with 7 others of other lengths, then
    decoded alone or in a batch, gives the same logprob bits at every step (how the prompt is chunked does
    not move them either: the next test)."""
    llm = LLM(str(tiny_llama), max_num_batched_tokens=4096, enable_prefix_caching=False)
    vocab = llm.engine.model_config.vocab_size
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(8, vocab, (int(n),), generator=g).tolist() for n in torch.randint(3, 90, (8,), generator=g)]
    sp = SamplingParams(max_tokens=8, temperature=0.0, logprobs=1, ignore_eos=True)
    alone = [llm.generate([p], sp)[0] for p in prompts]
    batched = llm.generate(prompts, sp)
    for a, b in zip(alone, batched):
        assert a.token_ids == b.token_ids
        assert [x.logprob for x in a.logprobs] == [x.logprob for x in b.logprobs]  # float equality: the same bits


def test_a_prompts_bits_do_not_depend_on_its_chunks_or_its_cached_prefix(tiny_llama):
    """A prompt of 2 blocks + 1 token, prefilled in one piece, in 16-token chunks (the last chunk one
    token) and again with its first 2 blocks found in the prefix cache (one token computed): the same
    tokens and logprob bits. The one-token chunk is a prompt row, so it takes the prefill attention
    kernel like the rest of its prompt; counted as a decode (vLLM's rule: any one-token query) it took
    the decode kernel, whose sums run in another order, and the bits moved by a few ulps."""
    g = torch.Generator().manual_seed(7)
    sp = SamplingParams(max_tokens=6, temperature=0.0, logprobs=1, ignore_eos=True)
    with LLM(str(tiny_llama), enable_prefix_caching=False) as llm:
        vocab = llm.engine.model_config.vocab_size
        prompts = [torch.randint(8, vocab, (33,), generator=g).tolist() for _ in range(3)]
        whole = llm.generate(prompts, sp)
    runs = []
    with LLM(str(tiny_llama), enable_prefix_caching=False, max_num_batched_tokens=16, max_num_seqs=1) as llm:
        runs.append(llm.generate(prompts, sp))  # chunks of 16, 16 and 1 tokens
    with LLM(str(tiny_llama), enable_prefix_caching=True) as llm:
        llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))  # cache 2 blocks each
        runs.append(llm.generate(prompts, sp))
        assert llm.engine.scheduler.stats().kv_cached_blocks > 0
    for run in runs:
        for a, b in zip(whole, run):
            assert a.token_ids == b.token_ids
            assert [x.logprob for x in a.logprobs] == [x.logprob for x in b.logprobs]  # the same bits
