"""One simulated engine replica: the reference engine's real `Scheduler` (and the KV-cache manager it
owns) stepped without a model; each step costs what the step-time model predicts (served: plus the served
overhead, times a seeded draw of mean one with the profile's step spread, served_overhead.jitter).

A step does what `LLMEngine.step` does around the forward: `schedule()`, then every sequence that
samples gets 1 + accepted-draft tokens (fake ids: a run of the request's own id, so block hashes stay
distinct per request and identical across its preemptions), a request ends when it reaches its
target length (`max_tokens`, or the EOS length it was given), then `update_from_output` commits the
step (computed tokens, draft rollback, caching full blocks, freeing finished requests). Speculative
decoding: `spec_k` drafts are offered to every decoding request and accepted in order (the first
rejection ends the run), seeded. `accept` is the acceptance rate the engine's own counters report
(accepted draft tokens / draft tokens, vLLM's `spec_decode_num_accepted_tokens / num_draft_tokens`),
not a per-token probability: with k drafts and each position accepted with probability p given the
ones before it, the counter reads (p + p^2 + ... + p^k) / k, so p is solved from `accept` for each k
(`position_probability`); --accept 0.7 used as p read 0.44-0.47 on the counter.

Invariant: the scheduler sees exactly the calls the engine makes, in the same order, so with the
same config and arrivals its decisions (admissions, chunks, preemptions, prefix hits) are the
engine's, step for step (tests/experiments/simulate/test_replica.py checks it against LLMEngine).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import NamedTuple

from reference_engine import EngineConfig, SamplingParams
from reference_engine.core.request import Request
from reference_engine.core.scheduler import Scheduler
from reference_engine.worker.step_record import shared

from experiments.simulate.gpu import allreduce_s, shard
from experiments.simulate.served_overhead import jitter, served_step
from experiments.simulate.step_model import ModelShape, Profile, StepShape, predict


def position_probability(rate: float, k: int) -> float:
    """p such that (p + p^2 + ... + p^k) / k == rate: a draft position's acceptance given the ones before it
    were accepted, for an acceptance rate (accepted / draft tokens) over runs of k drafts. Bisection."""
    if k <= 1 or rate in (0.0, 1.0):
        return rate
    lo, hi = 0.0, 1.0
    for _ in range(60):
        p = (lo + hi) / 2
        lo, hi = (p, hi) if sum(p ** i for i in range(1, k + 1)) / k < rate else (lo, p)
    return (lo + hi) / 2


class _Drafts(NamedTuple):  # what the runner hands update_from_output: ids and (greedy) no probs
    token_ids: list[int]
    probs: None = None


@dataclass
class Emitted:
    request_id: str
    n_tokens: int
    finished: bool
    finish_reason: str | None


@dataclass
class StepResult:
    duration_s: float
    shape: StepShape
    emitted: list[Emitted]
    scheduled: list[tuple[str, int]]  # (request id, tokens incl. drafts), in schedule order
    preempted: list[str]


@dataclass
class Replica:
    cfg: EngineConfig
    num_blocks: int
    shape: ModelShape
    profile: Profile
    spec_k: int = 0
    accept: float = 0.0
    lookahead: int = 0  # draft_model: KV slots past the scheduled tokens (= spec_k)
    seed: int = 0
    served: bool = False  # add the profile's served overhead (served_overhead.py): a served engine
    tensor: int = 1  # tensor-parallel ranks: each step costs one rank's share plus the all-reduces (gpu.py)
    sched: Scheduler = field(init=False)
    targets: dict[str, tuple[int, str]] = field(default_factory=dict)  # rid -> (output tokens, finish reason)
    steps: int = 0
    busy_s: float = 0.0
    spec: list[int] = field(default_factory=lambda: [0, 0, 0])  # drafts verified, draft tokens, accepted

    def __post_init__(self) -> None:
        self.sched = Scheduler(self.cfg, self.num_blocks, self.lookahead)
        self.rank_shape = shard(self.shape, self.tensor)
        self.rng = random.Random(self.seed)
        self.step_rng = random.Random(self.seed + 1)  # the served steps' draw (jitter): apart from the drafts'
        self._ids = 0

    def add(self, rid: str, prompt: list[int], max_tokens: int, out_len: int | None = None,
            arrival: float = 0.0) -> Request:
        """Queue a request; it ends after `out_len` tokens ("stop": an EOS) or `max_tokens` ("length")."""
        n = max_tokens if out_len is None else max(1, min(out_len, max_tokens))
        self.targets[rid] = (n, "length" if n >= max_tokens else "stop")
        req = Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                      arrival_time=arrival)
        req.fake_id = self._ids  # type: ignore[attr-defined]  # the id its fake tokens carry
        self._ids += 1
        self.sched.add(req)
        return req

    def has_work(self) -> bool:
        return self.sched.has_work()

    @property
    def outstanding(self) -> int:
        return len(self.sched.running) + len(self.sched.waiting)

    def step(self) -> StepResult | None:
        out = self.sched.schedule()
        if out.is_empty:
            return None
        shape = StepShape(tuple((len(s.token_ids), s.start + len(s.token_ids), 1 + len(s.drafts) if s.samples else 0)
                                for s in out.seqs), shared([s.req.block_table for s in out.seqs], self.cfg.block_size))
        emitted, accepted, drafts = [], {}, {}
        for s in out.seqs:
            if not s.samples:
                continue
            req = s.req
            a, p = 0, position_probability(self.accept, len(s.drafts))
            while a < len(s.drafts) and self.rng.random() < p:
                a += 1
            target, reason = self.targets[req.request_id]
            n = min(1 + a, target - len(req.output_token_ids))
            accepted[req.request_id] = min(a, n - 1) if s.drafts else 0
            if s.drafts:
                self.spec[0] += 1
                self.spec[1] += len(s.drafts)
                self.spec[2] += accepted[req.request_id]
            req.output_token_ids.extend([req.fake_id % 30000 + 1] * n)  # type: ignore[attr-defined]
            done = len(req.output_token_ids) >= target
            if done:
                req.finish(reason)
            elif self.spec_k:
                k = max(0, min(self.spec_k, req.num_tokens_left - 1))
                drafts[req.request_id] = _Drafts([0] * k) if k else None
            emitted.append(Emitted(req.request_id, n, done, reason if done else None))
        sched_ids = [(r.request_id, n) for r, n in out.scheduled]
        self.sched.update_from_output(out, accepted, drafts)
        for e in emitted:
            if e.finished:
                self.targets.pop(e.request_id, None)
        dt = predict(shape, self.rank_shape, self.profile) + allreduce_s(shape, self.shape, self.tensor, self.profile)
        if self.served:
            dt = served_step(self.profile, dt, len(shape.seqs)) * jitter(self.profile, self.step_rng)
        self.steps += 1
        self.busy_s += dt
        return StepResult(dt, shape, emitted, sched_ids, [r.request_id for r in out.preempted])

    def kv_used_fraction(self) -> float:
        return self.sched.kv.num_used / max(1, self.sched.kv.num_blocks)
