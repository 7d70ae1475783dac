"""Step shapes timed on the real reference engine: the calibration sweep, the teacher-forced trace
and the workload's greedy EOS lengths, all from `LLMEngine(record_steps=True)`.

`shapes` turns the engine's own step records (reference_engine StepRecord: who was scheduled with how
many tokens, who was preempted, who emitted) into the step-time model's `StepShape`s: a sequence's
context after the step is the tokens it had computed before (its prefix-cache hit at admission, 0
again after a preemption) plus the tokens scheduled now. The sweep's first steps warm the kernels
and are dropped.

Clock: every step is timed by its wall time (the record's `duration_s`: `LLMEngine.step` from the
schedule to the commit), the clock the teacher-forced trace is compared on. The engine runs with
the threads the served engine core gets (`serving_threads()`: every core), whose work thread CPU
time cannot see, so the measurement has to be quiet: run it under the bench lock on an idle machine
(the page records the load average).

The sweep's steps are drawn like real traffic, not uniform batches: closed-loop levels of 1-32
streams, each request with its own prompt length (log-uniform 16-1024 tokens) and output length
(1-96 tokens), so steps mix ragged contexts, prefill chunks next to decodes, and batches that
shrink and refill as requests end.
"""
from __future__ import annotations

import random

import numpy as np
from typing import Any, Iterable

from reference_engine import EngineConfig, SamplingParams

from experiments.simulate.step_model import StepShape

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
        out.append((StepShape(tuple(seqs), getattr(rec, "shared_kv_tokens", 0)), rec.duration_s))
    if seconds is not None:
        out = [(sh, t) for (sh, _), t in zip(out, seconds, strict=True)]
    return out


LEVELS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # closed-loop streams


def ragged(seed: int, vocab: int) -> list[tuple[int, list[int], int]]:
    """(streams, prompt, output tokens) per request: each level's requests, in order."""
    rng = random.Random(seed)
    out = []
    for c in LEVELS:
        for _ in range(c + 6):
            p = int(round(16 * 64 ** rng.random()))  # log-uniform 16-1024
            out.append((c, [rng.randrange(3, vocab) for _ in range(p)], rng.randint(1, 96)))
    return out


SHARED_LEVELS = (4, 8, 16, 32)  # closed-loop streams of the requests that share a prefix
PREFIXES = 2  # cached prefixes a shared level's requests begin with


def shared_prefix(seed: int, vocab: int) -> list[tuple[int, list[int], int]]:
    """(streams, prompt, output tokens) per request of the shared levels: each level's requests begin with one of
    PREFIXES prefixes (log-uniform 128-512 tokens, new each level) and go on with their own tokens (log-uniform 16-256),
    so with prefix caching on, a step's sequences read the same cached KV blocks (StepShape.shared): what every
    held-out test suite serves and the ragged levels never had (held-out round 4: docs/perf/2026-12-07-heldout-round4.md)."""
    rng = random.Random(seed + 1)
    out = []
    for c in SHARED_LEVELS:
        heads = [[rng.randrange(3, vocab) for _ in range(int(round(128 * 4 ** rng.random())))] for _ in range(PREFIXES)]
        for i in range(c + 6):
            tail = [rng.randrange(3, vocab) for _ in range(int(round(16 * 16 ** rng.random())))]
            out.append((c, heads[i % PREFIXES] + tail, rng.randint(1, 96)))
    return out


def closed_loop(eng, work: list[tuple[list[int], int]], concurrency: int, ignore_eos: bool = True,
                temperature: float = 0.0) -> list[int]:
    """Serve `work` (prompt, max tokens) keeping `concurrency` requests in the engine; -> each
    request's output length, in order. Greedy unless told: the sampler's cost is part of every timed
    step (a temperature-1 row costs a softmax and a draw over the vocabulary, an argmax row does not),
    so a sweep must sample as the runs it predicts do."""
    todo, ids, n = list(work)[::-1], [], {}
    while todo or eng.has_unfinished():
        while todo and len(eng.requests) < concurrency:
            p, m = todo.pop()
            ids.append(eng.add_request(p, SamplingParams(max_tokens=m, ignore_eos=ignore_eos,
                                                         temperature=temperature)))
        for d in eng.step():
            n[d.request_id] = n.get(d.request_id, 0) + len(d.new_token_ids)
    return [n.get(i, 0) for i in ids]


def median_of(runs: list[list[tuple[StepShape, float]]]) -> list[tuple[StepShape, float]]:
    """Per step, the median time over repeats that scheduled the same steps (a neighbour's burst lands
    on one repeat's step, rarely on the same step of two)."""
    base = [s for s, _ in runs[0]]
    for other in runs[1:]:
        if [s for s, _ in other] != base:
            raise RuntimeError("the repeats scheduled different steps")  # same prompts, same config
    return [(s, float(np.median([r[i][1] for r in runs]))) for i, s in enumerate(base)]


def sweep(cfg: EngineConfig, seed: int = 0, repeats: int = 3) -> tuple[list[tuple[StepShape, float]], dict]:
    """Time the sweep's steps (wall clock) on the engine of `cfg`: the ragged levels (their prompts share nothing, so
    every token is computed), then the shared-prefix levels (`shared_prefix`), prefix caching on and emptied before
    each repeat; each step's median over `repeats` runs of the same requests (the trace is timed the same way). Also returns the engine's dispatch settings (`effective_config()["paths"]`: the
    one-call layer's row limit)."""
    return sweep_many([cfg], seed, repeats)[0]


def sweep_many(cfgs: list[EngineConfig], seed: int = 0, repeats: int = 3) -> list[tuple[list[tuple[StepShape, float]], dict]]:
    """`sweep` of several models, interleaved: every engine is up at once, and each closed-loop level runs on
    every model before the next level starts. On a machine whose speed drifts within minutes (held-out round 2:
    a model's one-row step 57.9 ms, then 51.2 ms an hour later; docs/perf/2026-12-07-heldout-round2.md), models
    swept one after another are timed in different phases, and the fit reads the drift as a difference between
    them; interleaved, the drift lands on every model alike. Per model the same steps as `sweep` alone."""
    from reference_engine import LLMEngine  # the engine only where it runs: replay needs none

    engs = [LLMEngine(EngineConfig(**{**c.__dict__, "record_steps": True, "enable_prefix_caching": True}))
            for c in cfgs]
    reqs = [[("ragged", *x) for x in ragged(seed, e.model_config.vocab_size)]
            + [("shared", *x) for x in shared_prefix(seed, e.model_config.vocab_size)] for e in engs]
    runs: list[list] = [[] for _ in engs]
    for _ in range(repeats):
        start = [len(e.step_records) for e in engs]
        for e in engs:  # every repeat from an empty cache, so the repeats schedule the same steps
            e.reset_prefix_cache()
        for kind, c in [("ragged", c) for c in LEVELS] + [("shared", c) for c in SHARED_LEVELS]:
            for e, r in zip(engs, reqs):
                closed_loop(e, [(p, m) for k, cc, p, m in r if (k, cc) == (kind, c)], c)
        for run, e, s0 in zip(runs, engs, start):
            run.append(shapes(e.step_records[s0:])[WARM_STEPS:])
    return [(median_of(run), dict(e.effective_config().get("paths") or {})) for run, e in zip(runs, engs)]


def trace(cfg: EngineConfig, prompts: list[list[int]], max_tokens: list[int], concurrency: int,
          ignore_eos: bool, repeats: int = 3, temperature: float = 0.0) -> list[tuple[StepShape, float]]:
    """Teacher-forcing data: the engine serves `prompts` closed-loop at `concurrency` (a new request
    is added as one finishes), with prefix caching as configured; every step's shape with its median
    wall time over `repeats`. The later repeats form the same batches: the prefix cache is emptied
    before each, and each answer is held to the length the first repeat gave it (a sampled answer
    differs between repeats, which would change every later batch)."""
    from reference_engine import LLMEngine  # the engine only where it runs: replay needs none

    eng = LLMEngine(EngineConfig(**{**cfg.__dict__, "record_steps": True}))
    runs, work = [], list(zip(prompts, max_tokens))
    for i in range(repeats):
        eng.reset_prefix_cache()
        start = len(eng.step_records)
        got = closed_loop(eng, work, concurrency, ignore_eos if i == 0 else True, temperature)
        if i == 0:
            work = [(p, n) for (p, _), n in zip(work, got)]
        runs.append(shapes(eng.step_records[start:])[WARM_STEPS:])
    return median_of(runs)


def eos_lengths(cfg: EngineConfig, items: list[Any], ignore_eos: bool, temperature: float = 0.0) -> dict[str, int]:
    """Each work item's output length (its EOS, or max tokens) from the engine, offline. Greedy (the
    default) fp32 output is a property of the prompt, not of timing or batching (the engine's rows are
    batch-invariant): the simulator may know it in advance, and the served run gives the same answers.
    With a temperature, one draw of each answer."""
    from reference_engine import LLMEngine  # the engine only where it runs: replay needs none

    eng = LLMEngine(EngineConfig(**{**cfg.__dict__, "record_steps": False}))
    for it in items:
        eng.add_request(it.prompt_token_ids, SamplingParams(max_tokens=it.output_len, ignore_eos=ignore_eos,
                                                            temperature=temperature), request_id=it.request_id)
    n: dict[str, int] = {}
    while eng.has_unfinished():
        for d in eng.step():
            n[d.request_id] = n.get(d.request_id, 0) + len(d.new_token_ids)
    return n


def dump(rows: list[tuple[StepShape, float]], path) -> None:
    """Timed steps as JSON ([[[new, context, rows], ...], seconds(, shared KV tokens where any)] per step): refits
    need no rerun."""
    import json
    from pathlib import Path

    Path(path).write_text(json.dumps([[list(map(list, s.seqs)), d] + ([s.shared] if s.shared else []) for s, d in rows]))


def load_rows(path) -> list[tuple[StepShape, float]]:
    import json
    from pathlib import Path

    return [(StepShape(tuple(tuple(x) for x in s), *rest), d) for s, d, *rest in json.loads(Path(path).read_text())]
