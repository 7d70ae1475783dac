"""Sampling: each transform alone, and per-request seeds independent of batching."""
from __future__ import annotations

import pytest
import torch

from reference_engine import LLM, SamplingParams
from reference_engine.worker.sampler import apply_min_p, apply_penalties, apply_top_k_top_p, argmax, draw
from tests.reference_engine.helpers import random_prompts


def test_top_k_keeps_k_best():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0]])
    out = apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([1.0]))
    assert torch.isfinite(out).nonzero()[:, 1].tolist() == [1, 3]


def test_top_p_keeps_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    # vLLM's rule: drop a token when the mass up to it, counted from the least likely, is <= 1 - p
    out = apply_top_k_top_p(probs.log(), torch.tensor([-1]), torch.tensor([0.75]))
    assert torch.isfinite(out).nonzero()[:, 1].tolist() == [0, 1]  # 0.05 + 0.15 <= 0.25
    out = apply_top_k_top_p(probs.log(), torch.tensor([-1]), torch.tensor([0.01]))
    assert torch.isfinite(out).nonzero()[:, 1].tolist() == [0]  # always keeps the best token


def test_min_p_drops_tokens_below_fraction_of_best():
    probs = torch.tensor([[0.6, 0.3, 0.08, 0.02]])
    out = apply_min_p(probs.log(), torch.tensor([0.1]))  # threshold 0.06
    assert torch.isfinite(out).nonzero()[:, 1].tolist() == [0, 1, 2]


def test_penalties():
    from reference_engine.worker.sampler import SamplingBatch

    logits = torch.tensor([[2.0, -2.0, 1.0, 1.0]])
    one = lambda v: torch.tensor([v])  # noqa: E731
    b = SamplingBatch(one(1.0), one(-1), one(1.0), one(0.0), one(2.0), one(0.5), one(0.25),
                      prompt_ids=[[0]], output_ids=[[1, 2, 2]], generators=[None], num_logprobs=[None],
                      all_greedy=False)
    out = apply_penalties(logits, b)
    # token 0: in prompt, positive -> /2; token 1: output once, negative -> *2, -0.25 -0.5;
    # token 2: output twice -> /2 - 0.5 - 0.5; token 3 untouched
    assert out.tolist() == [[1.0, -4.75, -0.5, 1.0]]


def test_draw_follows_the_distribution():
    probs = torch.tensor([[0.7, 0.2, 0.1]]).repeat(20000, 1)
    ids = draw(probs, [None] * len(probs), torch.Generator().manual_seed(0))
    freq = torch.bincount(ids, minlength=3).float() / len(ids)
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.02)


@pytest.mark.slow
def test_seed_gives_same_tokens_alone_or_in_a_batch_of_32(tiny_llama):
    llm = LLM(str(tiny_llama))
    prompts = random_prompts(llm.engine.model_config.vocab_size, 32, 5, 40, seed=1)
    params = SamplingParams(max_tokens=24, temperature=1.0, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    [alone] = llm.generate([prompts[7]], params)
    others = [SamplingParams(max_tokens=24, temperature=0.8, seed=i, ignore_eos=True) for i in range(32)]
    others[7] = params
    batched = llm.generate(prompts, others)
    assert batched[7].token_ids == alone.token_ids
    [other_seed] = llm.generate([prompts[7]], SamplingParams(max_tokens=24, temperature=1.0, top_p=0.95,
                                                             top_k=50, seed=4321, ignore_eos=True))
    assert other_seed.token_ids != alone.token_ids
    [again] = llm.generate([prompts[7]], params)
    assert again.token_ids == alone.token_ids


def test_unseeded_sampling_varies_and_respects_top_k_1(tiny_llama):
    llm = LLM(str(tiny_llama))
    prompt = [[20, 21, 22, 23]]
    greedy = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0].token_ids
    topk1 = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=1.5, top_k=1, ignore_eos=True))[0].token_ids
    assert topk1 == greedy
    runs = {tuple(llm.generate(prompt, SamplingParams(max_tokens=12, temperature=2.0, ignore_eos=True))[0].token_ids)
            for _ in range(4)}
    assert len(runs) > 1


# --- issue 21: the five departures from vLLM v1, each pinned to vLLM's numbers -------------

def _probs(logits: torch.Tensor, **kw) -> torch.Tensor:
    """The distribution a sampling row draws from, through the whole pipeline (`process`)."""
    from reference_engine.worker.sampler import make_batch, process

    params = [SamplingParams(**kw)] * len(logits)
    b = make_batch(params, [[]] * len(logits), [[]] * len(logits), [None] * len(logits), "cpu")
    x, _ = process(logits, b)
    return x.softmax(-1)


def test_min_p_runs_before_top_p():
    # vLLM v1: temperature -> min-p -> top-k/top-p. min-p 0.4 of 0.4 drops 0.1 first, then top-p 0.75
    # of the renormalised [0.444, 0.333, 0.222] keeps two tokens.
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    got = _probs(logits, temperature=1.0, top_p=0.75, min_p=0.4)
    assert torch.allclose(got, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]]), atol=1e-6)


def test_top_p_one_row_loses_nothing_when_batched_with_a_top_p_row():
    from reference_engine.worker.sampler import apply_top_k_top_p

    logits = torch.randn(2, 32000, generator=torch.Generator().manual_seed(0)) * 3
    out = apply_top_k_top_p(logits.clone(), torch.tensor([-1, -1]), torch.tensor([1.0, 0.5]))
    assert torch.isfinite(out[0]).all()  # vLLM masks cumsum <= 1 - p: nothing at p = 1
    assert torch.equal(out[0], logits[0])
    assert (~torch.isfinite(out[1])).sum() > 0


def test_top_k_keeps_every_token_tied_with_the_kth():
    got = _probs(torch.tensor([[3.0, 2.0, 2.0, 1.0]]), temperature=1.0, top_k=2)
    want = torch.tensor([[3.0, 2.0, 2.0]]).softmax(-1)
    assert torch.allclose(got, torch.cat([want, torch.zeros(1, 1)], -1), atol=1e-6)


def test_temperature_below_1e_5_is_greedy():
    from reference_engine.worker.sampler import make_batch, sample

    # vLLM raises a request's positive temperature below 0.01 to 0.01 and rejects one above 2 ...
    assert SamplingParams(temperature=1e-6).temperature == 0.01 and SamplingParams(temperature=0).greedy
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=2.5)
    # ... and its sampler takes the argmax for any row whose temperature is below 1e-5
    params = [SamplingParams(temperature=1.0, top_p=0.9) for _ in range(64)]
    for p in params:
        p.temperature = 1e-6  # what reaches the sampler unclamped (e.g. SamplingBatch built directly)
    assert all(p.greedy for p in params)
    logits = torch.tensor([[0.0, 1e-6, 0.0]]).repeat(64, 1)
    b = make_batch(params, [[]] * 64, [[]] * 64, [None] * 64, "cpu")
    assert sample(logits, b, torch.Generator().manual_seed(0)).tolist() == [1] * 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_is_torchs_argmax_with_ties_infinities_and_nan(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (64, 5000), generator=g).to(dtype)  # many ties: the first maximum wins
    x[1, :] = float("-inf")
    x[2, 7], x[2, 3000] = float("inf"), float("inf")
    x[3, 100] = float("nan")  # NaN counts as the maximum, as in torch.argmax
    assert torch.equal(argmax(x), x.argmax(-1))
