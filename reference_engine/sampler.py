"""Sampling: pure functions from a batch of logits `(S, V)` to one token per row.

Order (as in vLLM): penalties -> temperature -> top-k -> top-p -> min-p -> draw.
Each stage is skipped when no row in the batch uses it, so an all-greedy batch is one
argmax. Seeded rows draw their noise from their own `torch.Generator`, so a request's
tokens do not depend on which other requests share its batch.

The draw uses the exponential-race trick (argmax of p / q, q ~ Exp(1)), which equals
sampling from p and lets every row use its own generator without a Python loop over V.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.outputs import TokenLogprob


@dataclass
class SamplingBatch:
    """Per-row settings as tensors, built by the runner once per step."""

    temperature: torch.Tensor  # (S,) float; 0 => greedy
    top_k: torch.Tensor  # (S,) int64; <= 0 => off
    top_p: torch.Tensor  # (S,) float
    min_p: torch.Tensor  # (S,) float
    repetition_penalty: torch.Tensor  # (S,)
    presence_penalty: torch.Tensor  # (S,)
    frequency_penalty: torch.Tensor  # (S,)
    prompt_ids: list[list[int]]  # for repetition penalty
    output_ids: list[list[int]]  # for all penalties
    generators: list[torch.Generator | None]
    num_logprobs: list[int | None]
    all_greedy: bool

    def any(self, name: str, off: float) -> bool:
        return bool((getattr(self, name) != off).any())


def token_mask(ids: list[list[int]], vocab: int, device) -> torch.Tensor:
    """(S, V) bool: which token ids occur in each row's list."""
    mask = torch.zeros(len(ids), vocab, dtype=torch.bool, device=device)
    for row, seq in enumerate(ids):  # one op per row, not per token
        if seq:
            mask[row, torch.tensor(seq, device=device)] = True
    return mask


def token_counts(ids: list[list[int]], vocab: int, device) -> torch.Tensor:
    counts = torch.zeros(len(ids), vocab, dtype=torch.float32, device=device)
    for row, seq in enumerate(ids):
        if seq:
            t = torch.tensor(seq, device=device)
            counts[row].index_add_(0, t, torch.ones_like(t, dtype=torch.float32))
    return counts


def apply_penalties(logits: torch.Tensor, b: SamplingBatch) -> torch.Tensor:
    v = logits.shape[-1]
    if b.any("repetition_penalty", 1.0):
        seen = token_mask([p + o for p, o in zip(b.prompt_ids, b.output_ids)], v, logits.device)
        pen = b.repetition_penalty[:, None]
        penalised = torch.where(logits > 0, logits / pen, logits * pen)
        logits = torch.where(seen, penalised, logits)
    if b.any("presence_penalty", 0.0) or b.any("frequency_penalty", 0.0):
        counts = token_counts(b.output_ids, v, logits.device)
        logits = logits - b.frequency_penalty[:, None] * counts
        logits = logits - b.presence_penalty[:, None] * (counts > 0).float()
    return logits


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask to -inf everything outside each row's top-k and top-p nucleus (keeps >= 1 token)."""
    use_k, use_p = bool((top_k > 0).any()), bool((top_p < 1.0).any())
    if not (use_k or use_p):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (S, V)
    remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if use_k:
        k = torch.where(top_k > 0, top_k, logits.shape[-1]).clamp(max=logits.shape[-1])
        rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
        remove |= rank >= k[:, None]
    if use_p:
        probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(-1)
        before = probs.cumsum(-1) - probs  # mass strictly before each token
        remove |= before >= top_p[:, None]
    remove[:, 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    if not bool((min_p > 0).any()):
        return logits
    probs = logits.softmax(-1)
    keep = probs >= min_p[:, None] * probs.max(-1, keepdim=True).values
    return logits.masked_fill(~keep, float("-inf"))


def draw(probs: torch.Tensor, generators: list[torch.Generator | None], default: torch.Generator) -> torch.Tensor:
    """Exponential race: argmax(p / q), q ~ Exp(1); seeded rows use their own generator."""
    q = torch.empty_like(probs)
    q.exponential_(generator=default)
    for row, g in enumerate(generators):
        if g is not None:
            q[row].exponential_(generator=g)
    return (probs / q).argmax(-1)


def process(logits: torch.Tensor, b: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (S, V) -> (the logits each sampling row draws from: penalised, tempered, masked;
    the greedy rows' tokens (S,)). Speculative verification needs the distributions, not a draw."""
    if b.all_greedy:
        return logits, logits.argmax(-1)
    logits = apply_penalties(logits, b)
    greedy_ids = logits.argmax(-1)  # penalties apply to greedy rows too
    temp = torch.where(b.temperature > 0, b.temperature, 1.0)
    x = logits / temp[:, None]
    x = apply_top_k_top_p(x, b.top_k, b.top_p)
    return apply_min_p(x, b.min_p), greedy_ids


def sample(logits: torch.Tensor, b: SamplingBatch, default_gen: torch.Generator) -> torch.Tensor:
    """logits: (S, V) float32 -> token ids (S,)."""
    if b.all_greedy:
        return logits.argmax(-1)
    x, greedy_ids = process(logits, b)
    sampled = draw(x.softmax(-1), b.generators, default_gen)
    return torch.where(b.temperature > 0, sampled, greedy_ids)


def make_batch(params: list, prompt_ids: list[list[int]], output_ids: list[list[int]],
               generators: list[torch.Generator | None], device) -> SamplingBatch:
    """One row per entry; `params` are SamplingParams."""
    def col(name, dtype=torch.float32):
        return torch.tensor([getattr(p, name) for p in params], dtype=dtype, device=device)

    needs_more = any(not p.greedy or p.repetition_penalty != 1.0 or p.presence_penalty != 0.0
                     or p.frequency_penalty != 0.0 for p in params)
    return SamplingBatch(
        temperature=col("temperature"), top_k=col("top_k", torch.int64), top_p=col("top_p"),
        min_p=col("min_p"), repetition_penalty=col("repetition_penalty"),
        presence_penalty=col("presence_penalty"), frequency_penalty=col("frequency_penalty"),
        prompt_ids=prompt_ids, output_ids=output_ids, generators=generators,
        num_logprobs=[p.logprobs for p in params], all_greedy=not needs_more,
    )


def logprobs_of(logits: torch.Tensor, token_ids: torch.Tensor, num: list[int | None]) -> list[TokenLogprob | None]:
    """Raw-model logprobs (before sampling transforms, as vLLM reports by default)."""
    if all(n is None for n in num):
        return [None] * len(num)
    lp = logits.log_softmax(-1)
    chosen = lp.gather(-1, token_ids[:, None]).squeeze(-1).tolist()
    k = max(n or 0 for n in num)
    top_v, top_i = lp.topk(k, dim=-1) if k else (None, None)
    out: list[TokenLogprob | None] = []
    for row, n in enumerate(num):
        if n is None:
            out.append(None)
            continue
        top = {int(i): float(v) for i, v in zip(top_i[row, :n].tolist(), top_v[row, :n].tolist())} if n else {}
        out.append(TokenLogprob(int(token_ids[row]), float(chosen[row]), top))
    return out
