"""The prefill attention kernel's cost per FLOP, measured apart from the sweep and held in the fit (held-out round
5's lesson: docs/perf/2026-12-07-heldout-round5.md).

In a sweep's steps with a prefill chunk, attention FLOPs (chunk x context) and the linear rows (chunk) rise together,
so the fit can trade one for the other at no cost in its own error: round 5's profile priced attention at 4.7x its
FLOP roofline, while the kernel alone (`ops.prefill`, timed here per fit model) ran at 2.0-2.6x on every geometry,
and the linear rows took the rest. On a step where attention is a larger share than the sweep's average (a short
chunk over a long cached prefix: the held-out suite's shape) that trade put the prediction 13-24 % slow, on a fit
model too; with the kernel's own ratio held, round 5's sweep fitted as well (|error| 4.1 / 9.5 % either way) and the
held-out chunk came out within 2 %.

`prefill_attention` times the kernel on random tensors of each model's head geometry (no weights, no engine) over
SHAPES (new tokens, cached tokens before them) and returns the median of time over the step model's attention term
at the peak (`features`): the mixed regime's `attention` coefficient (calibrate.calibrate's `fixed`)."""
from __future__ import annotations

import statistics
import time

from experiments.simulate.step_model import ModelShape, Profile, StepShape, features

SHAPES = ((64, 0), (128, 0), (448, 0), (64, 448), (128, 448), (256, 256), (128, 960))  # (chunk, cached before it)
BLOCK = 16


def attention_seconds(m: ModelShape, new: int, cached: int, threads: int, repeats: int = 5) -> float:
    """Median seconds of one layer's prefill attention for one sequence's chunk of `new` tokens after `cached`
    tokens, in the engine's kernel, times the model's layers."""
    import torch

    from reference_engine.kernels import ops

    dt = getattr(torch, m.dtype)
    ctx = cached + new
    blocks = -(-ctx // BLOCK)
    kc = torch.randn(blocks, BLOCK, m.kv_heads, m.head_dim).to(dt)
    vc = torch.randn_like(kc)
    q = torch.randn(new, m.heads, m.head_dim).to(dt)
    out = torch.empty_like(q)
    tables = torch.arange(blocks, dtype=torch.int64).view(1, -1)
    lens, starts = torch.tensor([ctx], dtype=torch.int64), torch.tensor([0, new], dtype=torch.int64)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        def one() -> float:
            t0 = time.perf_counter()
            ops.prefill(q, kc, vc, tables, lens, starts, m.head_dim ** -0.5, out)
            return time.perf_counter() - t0

        one()  # warm: the first call's pages
        return statistics.median(one() for _ in range(repeats)) * m.layers
    finally:
        torch.set_num_threads(before)


def prefill_attention(models: list[ModelShape], prof: Profile, threads: int) -> dict:
    """The kernel's time over the attention term at the profile's peak, per model and shape; `ratio`: their median
    (the coefficient to hold)."""
    per: dict[str, list[float]] = {}
    for m in dict.fromkeys(models):
        for new, cached in SHAPES:
            f = features(StepShape(((new, cached + new, 1),)), m, prof)["attention"]
            per.setdefault(m.signature, []).append(attention_seconds(m, new, cached, threads) / f)
    return {"ratio": statistics.median(r for rs in per.values() for r in rs),
            "per_model": {k: statistics.median(v) for k, v in per.items()}, "shapes": [list(s) for s in SHAPES]}


__all__ = ["SHAPES", "attention_seconds", "prefill_attention"]
