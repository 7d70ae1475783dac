"""Differential test: our sampler against vLLM 0.32.0's own sampler code, on the same logits.

All cases go to ONE `.venv-vllm/bin/python tests/reference_engine/worker/vllm_sampler_probe.py` run (vLLM's
import costs seconds), which runs vLLM's `Sampler.forward` (float32 cast, MinTokens processor,
penalties, greedy argmax, temperature, MinP processor, `apply_top_k_top_p`) and returns, per row,
the distribution a sampling row draws from, the greedy rows' tokens and the raw logprobs. We compare:
- sampling rows: the probability vectors, same support exactly, values within 1e-6;
- greedy rows (temperature < 1e-5): the token;
- rows asking for logprobs: the chosen token's logprob and the top-n (ids and values) within 1e-6.

Grid (each entry one batch; "alone" repeats every row of a batch as a batch of one):
  fix3   p=[.4,.3,.2,.1], top_p=.75, min_p=.4          -> vLLM [.571, .429, 0, 0]
  fix4   V=32000, rows top_p=1.0 and top_p=0.5 batched (+ the top_p=1.0 row alone)
  fix5   logits [3,2,2,1], top_k=2                      -> vLLM [.576, .212, .212, 0]
  fix5   temperature 1e-6 (vLLM raises it to 0.01), temperature 0 (greedy), temperature 1, top_p .9
  single V=256, one row per setting, batched and alone: temperature .05/.5/1/1.7/2,
         top_k 1/2/5/50/255/256/300, top_p .05/.3/.75/.9/.99/1, min_p .01/.1/.3/.9,
         repetition 0.5/1.3/2, presence -1/.5/2, frequency -.5/.4/1.5, min_tokens 3 (EOS + 2 stop ids banned)
  random 8 batches x 8 rows, V=1024, every field drawn per row (greedy rows 0 and 1e-6 among them,
         penalties over random prompt/output ids, min_tokens, logprobs 0/1/5)
  ties   3 batches x 8 rows, V=512, logits rounded to integers (hundreds of ties at every cut)
  bf16   3 batches x 8 rows, V=1024, bf16 logits (cast to float32 inside, as vLLM does)
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from reference_engine import SamplingParams
from reference_engine.worker.sampler import logprobs_of, make_batch, process
from tests.shared_vllm import REPO, VENV, need_vllm_venv

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

EOS = 2
DEFAULT = dict(temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
               frequency_penalty=0.0, min_tokens=0, stop_token_ids=[], prompt=[5, 6, 7], output=[8, 9, 9],
               logprobs=None)
SINGLES = ([("temperature", t) for t in (0.05, 0.5, 1.0, 1.7, 2.0)]
           + [("top_k", k) for k in (1, 2, 5, 50, 255, 256, 300)]
           + [("top_p", p) for p in (0.05, 0.3, 0.75, 0.9, 0.99, 1.0)]
           + [("min_p", m) for m in (0.01, 0.1, 0.3, 0.9)]
           + [("repetition_penalty", r) for r in (0.5, 1.3, 2.0)]
           + [("presence_penalty", v) for v in (-1.0, 0.5, 2.0)]
           + [("frequency_penalty", v) for v in (-0.5, 0.4, 1.5)])


def row(**kw) -> dict:
    return {**DEFAULT, **kw}


def random_row(rng: random.Random, vocab: int) -> dict:
    pick = rng.choice
    return row(temperature=pick([0.0, 1e-6, 0.3, 0.7, 1.0, 1.0, 1.5]), top_k=pick([-1, -1, 1, 3, 20, vocab // 2]),
               top_p=pick([1.0, 1.0, 0.2, 0.6, 0.9, 0.97]), min_p=pick([0.0, 0.0, 0.02, 0.1, 0.5]),
               repetition_penalty=pick([1.0, 1.0, 0.7, 1.2]), presence_penalty=pick([0.0, 0.0, -0.5, 1.0]),
               frequency_penalty=pick([0.0, 0.0, 0.3, -1.0]), min_tokens=pick([0, 0, 4]),
               stop_token_ids=rng.sample(range(3, vocab), 2), logprobs=pick([None, None, 0, 1, 5]),
               prompt=[rng.randrange(vocab) for _ in range(rng.randrange(1, 30))],
               output=[rng.randrange(vocab) for _ in range(rng.randrange(0, 6))])


def grid() -> list[tuple[str, torch.Tensor, list[dict]]]:
    g = torch.Generator().manual_seed(21)
    rng = random.Random(21)
    cases = [("fix3 min-p before top-p", torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log(), [row(top_p=0.75, min_p=0.4)]),
             ("fix4 top_p=1 beside top_p<1", torch.randn(2, 32000, generator=g) * 3, [row(), row(top_p=0.5)]),
             ("fix5 top-k ties", torch.tensor([[3.0, 2.0, 2.0, 1.0]]), [row(top_k=2, prompt=[0], output=[])]),
             ("fix5 temperature 1e-6", torch.randn(4, 64, generator=g) * 2,
              [row(temperature=1e-6, top_p=0.9), row(), row(top_p=0.9), row(temperature=0.0)])]
    logits = torch.randn(len(SINGLES) + 1, 256, generator=g) * 2
    singles = [row(**{k: v}) for k, v in SINGLES] + [row(min_tokens=3, stop_token_ids=[10, 11], output=[8])]
    cases.append(("single settings", logits, singles))
    cases += [(f"single alone {i}", logits[i:i + 1], [r]) for i, r in enumerate(singles)]
    cases.append(("fix4 alone", cases[1][1][:1], [row()]))
    for b in range(8):
        cases.append((f"random {b}", torch.randn(8, 1024, generator=g) * rng.choice([1.0, 3.0]),
                      [random_row(rng, 1024) for _ in range(8)]))
    for b in range(3):
        cases.append((f"ties {b}", (torch.randn(8, 512, generator=g) * 2).round(),
                      [random_row(rng, 512) for _ in range(8)]))
    for b in range(3):
        cases.append((f"bf16 {b}", (torch.randn(8, 1024, generator=g) * 3).bfloat16(),
                      [random_row(rng, 1024) for _ in range(8)]))
    return cases


@pytest.fixture(scope="module")
def vllm_results(tmp_path_factory):
    need_vllm_venv()
    cases = grid()
    d = tmp_path_factory.mktemp("vs-vllm")
    json.dump([{"bf16": x.dtype == torch.bfloat16, "eos": EOS, "rows": rows} for _, x, rows in cases],
              open(d / "cases.json", "w"))
    np.savez(d / "cases.npz", **{f"logits{i}": x.float().numpy() for i, (_, x, _) in enumerate(cases)})
    probe = REPO / "tests" / "reference_engine" / "worker" / "vllm_sampler_probe.py"
    r = subprocess.run([str(VENV / "bin" / "python"), str(probe), str(d / "cases.json"), str(d / "cases.npz"),
                        str(d / "out.npz")], capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "OMP_NUM_THREADS": "1"})
    if r.returncode == 3:
        pytest.fail(f"vLLM's sampler API moved (this test pins vLLM 0.32.0): {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-3000:]
    return cases, dict(np.load(d / "out.npz"))


def ours(logits: torch.Tensor, rows: list[dict]):
    params = [SamplingParams(max_tokens=64, **{k: v for k, v in r.items() if k not in ("prompt", "output")})
              for r in rows]
    b = make_batch(params, [r["prompt"] for r in rows], [r["output"] for r in rows], [None] * len(rows), "cpu",
                   [sorted({EOS, *r["stop_token_ids"]}) for r in rows])
    x, greedy = process(logits, b)
    return x.softmax(-1), greedy, params


def test_grid_prints_in_the_docstring():
    names = {n.split(" ")[0] for n, _, _ in grid()}
    assert names == {"fix3", "fix4", "fix5", "single", "random", "ties", "bf16"}
    assert all(n.split(" ")[0] in __doc__ for n in names)


def test_distributions_equal_vllms(vllm_results):
    cases, out = vllm_results
    compared = 0
    for i, (name, logits, rows) in enumerate(cases):
        probs, greedy, params = ours(logits, rows)
        for j, p in enumerate(params):
            where = f"{name} row {j} {rows[j]}"
            if p.greedy:
                assert int(greedy[j]) == int(out[f"greedy{i}"][j]), where
                continue
            theirs = torch.from_numpy(out[f"probs{i}"][j])
            assert torch.equal(probs[j] > 0, theirs > 0), f"{where}: support differs"
            assert (probs[j] - theirs).abs().max() <= 1e-6, where
            compared += 1
    assert compared > 100


def test_issue_cases_have_vllms_numbers(vllm_results):
    cases, out = vllm_results
    assert np.allclose(out["probs0"][0], [4 / 7, 3 / 7, 0, 0], atol=1e-6)
    assert (out["probs1"][0] > 0).all()  # top_p = 1 loses nothing beside a top_p = 0.5 row
    assert np.allclose(out["probs2"][0], [0.576117, 0.211942, 0.211942, 0], atol=1e-6)
    assert out["greedy3"][3] == int(cases[3][1][3].argmax())


def test_logprobs_equal_vllms(vllm_results):
    cases, out = vllm_results
    checked = 0
    for i, (name, logits, rows) in enumerate(cases):
        nums = [r["logprobs"] for r in rows]
        if all(n is None for n in nums):
            continue
        ids = logits.float().argmax(-1)
        theirs = torch.from_numpy(out[f"logprobs{i}"])
        for j, lp in enumerate(logprobs_of(logits, ids, nums)):
            if lp is None:
                continue
            assert abs(lp.logprob - float(theirs[j, ids[j]])) <= 1e-6, name
            k = max(n or 0 for n in nums)  # vLLM takes the batch's largest top-n (ties: same pick as ours)
            top_v, top_i = (theirs[j].topk(k) if k else (torch.zeros(0), torch.zeros(0, dtype=torch.long)))
            top_v, top_i = top_v[:nums[j]], top_i[:nums[j]]
            assert list(lp.top) == top_i.tolist(), name
            assert np.allclose(list(lp.top.values()), top_v.tolist(), atol=1e-6), name
            checked += 1
    assert checked > 5
