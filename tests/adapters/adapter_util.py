"""Helpers shared by the adapter tests: seeded prompts, the offline reference answer,
and running requests through any `Engine` while checking the stream invariants."""
from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

from adapters.base import Engine, GenerationRequest, SamplingConfig, TokenEvent


def vocab_size(model_dir) -> int:
    return json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]


def random_prompts(model_dir, n: int, seed: int = 0, lo: int = 4, hi: int = 40) -> list[list[int]]:
    """`n` prompts of random lengths in [lo, hi), ids above the first few special ids."""
    rng, vocab = random.Random(seed), vocab_size(model_dir)
    return [[rng.randrange(3, vocab) for _ in range(rng.randrange(lo, hi))] for _ in range(n)]


def reference_greedy(llm, prompts, max_tokens, ignore_eos: bool = True):
    """The offline engine's greedy completions (`max_tokens` an int or one per prompt)."""
    from reference_engine import SamplingParams

    lens = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=ignore_eos) for m in lens]
    return llm.generate(prompts, params)


def check_stream(events: list[TokenEvent], request_id: str) -> None:
    """The interface's invariants: one finished event, the last; receive times never go back."""
    assert events, f"{request_id}: no events"
    assert [e.finished for e in events].count(True) == 1 and events[-1].finished, events
    assert all(e.request_id == request_id for e in events)
    times = [e.recv_ns for e in events]
    assert all(t > 0 for t in times) and times == sorted(times), times


def tokens(events: list[TokenEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


async def collect(engine: Engine, request: GenerationRequest) -> list[TokenEvent]:
    events = [ev async for ev in engine.generate(request)]
    check_stream(events, request.request_id)
    return events


async def run_all(engine: Engine, prompts, max_tokens, **sampling) -> list[list[TokenEvent]]:
    """All prompts at once (concurrently); returns each request's events, in prompt order."""
    lens = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    reqs = [GenerationRequest(f"r{i}", p, SamplingConfig(max_tokens=m, **sampling))
            for i, (p, m) in enumerate(zip(prompts, lens))]
    return list(await asyncio.gather(*(collect(engine, r) for r in reqs)))
