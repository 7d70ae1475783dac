"""Verification glue for the model runner: target logits at each request's 1 + j rows ->
the tokens each request emits this step (accepted drafts, then one from the target).

Row j of a request is the target's prediction after its context + its first j drafts, so
penalties see those drafts as output (a request's distribution at a position never depends
on whether it got there by speculation).
"""
from __future__ import annotations

import torch

from reference_engine.worker.sampler import make_batch, process
from reference_engine.spec_decode.rejection_sampler import greedy_verify, rejection_sample


def verify(raw: torch.Tensor, reqs: list, drafts: list[list[int]], default_gen: torch.Generator) -> list[list[int]]:
    """raw (R, V): rows laid out request by request, 1 + len(drafts[i]) each."""
    params, prompts, outs, gens, stops = [], [], [], [], []
    for r, d in zip(reqs, drafts):
        p = r.params
        # drafts count as output for penalties and for min_tokens
        counted = p.penalized or p.min_tokens > len(r.output_token_ids)
        for j in range(len(d) + 1):
            params.append(p)
            prompts.append(r.prompt_token_ids)
            outs.append(r.output_token_ids + d[:j] if counted and j else r.output_token_ids)
            gens.append(r.generator)
            stops.append(r.stop_ids)
    sb = make_batch(params, prompts, outs, gens, raw.device, stops)
    x, greedy_ids = process(raw, sb)
    probs = None if sb.all_greedy else x.softmax(-1)
    greedy = greedy_ids.tolist()
    out, row = [], 0
    for r, d in zip(reqs, drafts):
        n = len(d) + 1
        if r.params.greedy:
            out.append(greedy_verify(greedy[row:row + n], d))
        else:
            q = r.spec_probs[:len(d)] if (d and r.spec_probs is not None) else None
            out.append(rejection_sample(probs[row:row + n], d, q, r.generator or default_gen))
        row += n
    return out
