"""The scheduler: which requests run this step, and how many tokens each.

Semantics follow vLLM v1: there is no separate "prefill phase". Every request simply
has `num_new_tokens` whose KV is not computed yet (the rest of its prompt, or the one
token sampled last step), and each step spends one token budget
(`max_num_batched_tokens`) across them:

1. Running requests first, in admission order. A prompt too long for what is left of
   the budget gets a chunk of it (chunked prefill). If the pool has no blocks for a
   request, the most recently admitted running request is preempted (blocks dropped,
   recomputed later) until it fits, or the request itself is the one preempted.
2. Then waiting requests, first come first served, while budget, blocks and the
   `max_num_seqs` cap allow. Nobody is admitted in a step that preempted (it would
   just be preempted again). Preempted requests wait at the front of the queue.

Invariant: after `schedule()`, every scheduled request owns enough blocks for
`num_computed_tokens + num_scheduled` tokens.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from reference_engine.config import EngineConfig
from reference_engine.kv_cache import BlockPool, blocks_needed
from reference_engine.request import Request, Status


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens this step)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, cfg: EngineConfig, pool: BlockPool):
        self.cfg = cfg
        self.pool = pool
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.cfg.max_num_batched_tokens
        chunked = self.cfg.enable_chunked_prefill
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_new_tokens, budget)
            if not chunked and n < req.num_new_tokens:
                i += 1
                continue  # waits for a step with room for the whole prompt
            if not self._grow(req, n, out):
                break  # req itself was preempted: everyone after it already was
            out.scheduled.append((req, n))
            budget -= n
            i += 1
        if out.preempted:
            return out
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            n = min(req.num_new_tokens, budget)
            if not chunked and n < req.num_new_tokens:
                break
            need = blocks_needed(n, self.pool.block_size)
            if not self.pool.can_allocate(need):
                break
            self.waiting.popleft()
            req.block_table = self.pool.allocate(need)
            req.status = Status.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            self.running.append(req)
            out.scheduled.append((req, n))
            budget -= n
        return out

    def _grow(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Give `req` blocks for `n` more tokens, preempting from the back. False if req was preempted."""
        need = blocks_needed(req.num_computed_tokens + n, self.pool.block_size) - len(req.block_table)
        while not self.pool.can_allocate(need):
            victim = self.running.pop()
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is req:
                return False
        if need > 0:
            req.block_table += self.pool.allocate(need)
        return True

    def _preempt(self, req: Request) -> None:
        self.pool.free(req.block_table)
        req.block_table = []
        req.num_computed_tokens = 0
        req.status = Status.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def finish(self, req: Request) -> None:
        """Release a finished (or aborted) request's blocks and forget it."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.pool.free(req.block_table)
        req.block_table = []
