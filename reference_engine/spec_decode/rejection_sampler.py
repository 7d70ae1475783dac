"""Verifying draft tokens: exact speculative sampling (Leviathan et al. 2023, Chen et al. 2023).

Per request, k draft tokens d_1..d_k were drawn from q_1..q_k, and one target pass gave
p_1..p_{k+1} (row j: the target's next-token distribution after the context + d_1..d_{j-1}):

    for j = 1..k:  accept d_j with probability min(1, p_j(d_j) / q_j(d_j)); stop at the first rejection
    rejected d_j:  emit a token from norm(max(p_j - q_j, 0)) in its place
    all accepted:  emit a bonus token from p_{k+1}

Each emitted token is then distributed exactly as the target would have sampled it, so
speculation changes speed, never the output distribution. Special cases:
- greedy: p and q are point masses on the argmaxes: accept while they agree, then emit the
  target's argmax (`greedy_verify`), so greedy output is identical with speculation off;
- a proposer without distributions (n-gram) is a point mass q_j = delta(d_j): d_j is accepted
  with probability p_j(d_j), and the residual is p_j with d_j removed.

Randomness: k uniforms and then one draw, always, from the request's generator, so a seeded
request consumes the same numbers whatever its batch-mates do.
"""
from __future__ import annotations

import torch


def greedy_verify(target_ids: list[int], draft_ids: list[int]) -> list[int]:
    """target_ids: the target's argmax at each of the k+1 rows -> accepted drafts + the target's token."""
    a = 0
    while a < len(draft_ids) and draft_ids[a] == target_ids[a]:
        a += 1
    return draft_ids[:a] + [target_ids[a]]


def draw_one(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from unnormalised probs (V,): exponential race, as sampler.draw."""
    q = torch.empty_like(probs).exponential_(generator=generator)
    return int((probs / q).argmax())


def rejection_sample(target_probs: torch.Tensor, draft_ids: list[int], draft_probs: torch.Tensor | None,
                     generator: torch.Generator | None) -> list[int]:
    """target_probs (k+1, V), draft_probs (k, V) or None (point masses) -> accepted drafts + one token."""
    k = len(draft_ids)
    dev = target_probs.device
    a = 0
    if k:
        d = torch.tensor(draft_ids, device=dev)
        rows = torch.arange(k, device=dev)
        p = target_probs[rows, d]  # (k,)
        q = draft_probs[rows, d] if draft_probs is not None else torch.ones_like(p)
        u = torch.rand(k, generator=generator, device=dev)
        accepted = (u * q < p).tolist()  # u < p/q without dividing by q
        while a < k and accepted[a]:
            a += 1
    if a == k:
        return draft_ids + [draw_one(target_probs[k], generator)]
    if draft_probs is not None:
        residual = (target_probs[a] - draft_probs[a]).clamp_min(0)
    else:
        residual = target_probs[a].clone()
        residual[draft_ids[a]] = 0
    if not bool(residual.sum() > 0):  # p == q up to rounding: rejection had probability ~0
        residual = target_probs[a]
    return draft_ids[:a] + [draw_one(residual, generator)]
