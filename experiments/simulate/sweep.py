"""Step shapes timed on the real reference engine: the calibration sweep, the teacher-forced trace
and the workload's greedy EOS lengths, all from `LLMEngine(record_steps=True)`.

`shapes` turns the engine's own step records (reference_engine StepRecord: who was scheduled with how
many tokens, who was preempted, who emitted) into the step-time model's `StepShape`s: a sequence's
context after the step is the tokens it had computed before (its prefix-cache hit at admission, 0
again after a preemption) plus the tokens scheduled now. The sweep's first steps warm the kernels
and are dropped.

Clocks: a step's wall time (the record's `duration_s`) counts the time a busy neighbour held the
core; the engine runs its compute on the calling thread when `num_threads` is 1 (as `inferlab serve`
does on 2 cores), so that thread's CPU time (`time.thread_time` around `step()`) is the step's time
on a quiet machine. The sweep fits CPU time; the trace returns both, so the page can show what the
neighbours add.
"""
from __future__ import annotations

import random
import time
from typing import Any, Iterable

from reference_engine import EngineConfig, SamplingParams

from experiments.simulate.step_model import StepShape

# (streams, prompt tokens, output tokens): decode at short/long contexts and batch sizes, prefill chunks
DECODE = [(b, p, 8) for b in (1, 2, 4, 8, 16) for p in (32, 256, 640) if b * p <= 4096]
PREFILL = [(1, p, 2) for p in (16, 64, 128, 256, 512, 1024)] + [(4, 300, 2)]
WARM_STEPS = 3


def engine_config(model: str, dtype: str, options: dict[str, Any], **over: Any) -> EngineConfig:
    """The engine's config as the harness would start it: the config's engine options that
    EngineConfig knows, then `over`."""
    fields = set(EngineConfig.__dataclass_fields__) - {"model", "dtype"}
    return EngineConfig(model=model, dtype=dtype, **{**{k: v for k, v in options.items() if k in fields}, **over})


def shapes(records: Iterable[Any], seconds: list[float] | None = None) -> list[tuple[StepShape, float]]:
    """(shape, measured seconds) per step record, contexts tracked across steps; `seconds` replaces the
    records' wall times (e.g. CPU times, one per record)."""
    done: dict[str, int] = {}
    out = []
    for rec in records:
        for rid in rec.preempted:
            done[rid] = 0
        seqs = []
        for rid, n, _kind in rec.scheduled:
            start = done.get(rid, 0) or rec.prefix_hits.get(rid, 0)
            rows = 1 + rec.spec_proposed.get(rid, 0) if rid in rec.new_tokens else 0
            seqs.append((n, start + n, rows))
            done[rid] = start + n - (rec.spec_proposed.get(rid, 0) - rec.spec_accepted.get(rid, 0))
        for rid in rec.finished:
            done.pop(rid, None)
        out.append((StepShape(tuple(seqs)), rec.duration_s))
    if seconds is not None:
        out = [(sh, t) for (sh, _), t in zip(out, seconds, strict=True)]
    return out


def step(eng, cpu: list[float]) -> None:
    """One engine step; its thread CPU seconds appended when it ran (made a step record)."""
    n, t = len(eng.step_records), time.thread_time()
    eng.step()
    if len(eng.step_records) > n:
        cpu.append(time.thread_time() - t)


def _run_group(eng, streams: int, prompt: int, out: int, rng: random.Random, vocab: int, cpu: list) -> None:
    params = SamplingParams(max_tokens=out, ignore_eos=True)
    for _ in range(streams):
        eng.add_request([rng.randrange(3, vocab) for _ in range(prompt)], params)
    while eng.has_unfinished():
        step(eng, cpu)


def sweep(cfg: EngineConfig, seed: int = 0, repeats: int = 2) -> list[tuple[StepShape, float]]:
    """Time the sweep's step shapes on the engine of `cfg` (prefix caching off: every token computed).
    Times are thread CPU seconds; the sweep runs `repeats` times with the same prompts and each step
    keeps its fastest time (cache and memory-bandwidth contention from neighbours still show in CPU
    time; the fastest of two is hit only if both were)."""
    from reference_engine import LLMEngine  # the engine only where it runs: replay needs none

    eng = LLMEngine(EngineConfig(**{**cfg.__dict__, "record_steps": True, "enable_prefix_caching": False}))
    runs = []
    for _ in range(repeats):
        rng, vocab = random.Random(seed), eng.model_config.vocab_size
        start, cpu = len(eng.step_records), []
        for g in DECODE + PREFILL:
            _run_group(eng, *g, rng, vocab, cpu)
        runs.append(shapes(eng.step_records[start:], cpu))
    best = runs[0]
    for other in runs[1:]:
        if [s for s, _ in other] != [s for s, _ in best]:
            raise RuntimeError("the sweep's repeats scheduled different steps")  # same prompts, same config
        best = [(s, min(d, e)) for (s, d), (_, e) in zip(best, other)]
    return best[WARM_STEPS:]


def trace(cfg: EngineConfig, prompts: list[list[int]], max_tokens: list[int], concurrency: int,
          ignore_eos: bool) -> tuple[list[tuple[StepShape, float]], list[tuple[StepShape, float]]]:
    """Teacher-forcing data: the engine serves `prompts` closed-loop at `concurrency` (a new request
    is added as one finishes), with prefix caching as configured; every step's shape with its CPU
    time, and with its wall time."""
    from reference_engine import LLMEngine  # the engine only where it runs: replay needs none

    eng = LLMEngine(EngineConfig(**{**cfg.__dict__, "record_steps": True}))
    todo, cpu = list(zip(prompts, max_tokens))[::-1], []
    while todo or eng.has_unfinished():
        while todo and len(eng.requests) < concurrency:
            p, m = todo.pop()
            eng.add_request(p, SamplingParams(max_tokens=m, ignore_eos=ignore_eos))
        step(eng, cpu)
    return shapes(eng.step_records, cpu)[WARM_STEPS:], shapes(eng.step_records)[WARM_STEPS:]


def eos_lengths(cfg: EngineConfig, items: list[Any], ignore_eos: bool) -> dict[str, int]:
    """Each work item's greedy output length (its EOS, or max tokens) from the engine, offline. Greedy
    fp32 output is a property of the prompt, not of timing: the simulator may know it in advance."""
    from reference_engine import LLMEngine  # the engine only where it runs: replay needs none

    eng = LLMEngine(EngineConfig(**{**cfg.__dict__, "record_steps": False}))
    for it in items:
        eng.add_request(it.prompt_token_ids, SamplingParams(max_tokens=it.output_len, ignore_eos=ignore_eos),
                        request_id=it.request_id)
    n: dict[str, int] = {}
    while eng.has_unfinished():
        for d in eng.step():
            n[d.request_id] = n.get(d.request_id, 0) + len(d.new_token_ids)
    return n
