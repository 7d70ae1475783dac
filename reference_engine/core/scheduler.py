"""The scheduler: which requests run this step, how many tokens each, and the bookkeeping after.

Semantics follow vLLM v1: there is no separate "prefill phase". Every request simply
has `num_new_tokens` whose KV is not computed yet (the rest of its prompt, or the one
token sampled last step, plus any draft tokens proposed for it), and each step spends one
token budget (`max_num_batched_tokens`) across them:

1. Running requests first, in admission order. A prompt too long for what is left of
   the budget gets a chunk of it (chunked prefill); drafts that do not fit are dropped.
   If the pool has no blocks for a request, the most recently admitted running request is
   preempted (blocks released, recomputed later) until it fits, or the request itself is
   the one preempted.
2. Then waiting requests, first come first served, while budget, blocks and the
   `max_num_seqs` cap allow. A request starts from the longest prefix of its tokens found
   in the prefix cache (its own blocks, after a preemption, if nobody evicted them) and
   spends budget only on the rest. Nobody is admitted in a step that preempted (it would
   just be preempted again). Preempted requests wait at the front of the queue.

The scheduler builds and owns the KV-cache manager (docs/architecture.md: who owns what) (`self.kv`, as vLLM v1's `Scheduler.__init__`
and nano-vllm's scheduler do): every block change (admission with prefix-cache hits, growth,
preemption, speculative rollback, free) goes through it, and nobody else holds it. The engine reads
its counters from `stats()`. The runner gets `SchedulerOutput.seqs`, a plain per-step record (query
tokens, first position, block table, whether the sequence samples and its drafts), never the pool.
After the forward, `update_from_output` commits the step: computed tokens advance by what was
scheduled minus rejected drafts, full blocks are cached, finished requests are freed, new drafts stored.

Invariants: after `schedule()`, every scheduled request owns blocks for
`num_computed_tokens + num_scheduled (+ lookahead)` tokens; after `update_from_output`,
`num_computed_tokens <= num_tokens` and nothing past `num_tokens` is counted as computed.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from reference_engine.config import EngineConfig
from reference_engine.core.kv_cache_manager import KVCacheManager
from reference_engine.core.request import Request, Status
from reference_engine.core.scheduler_output import ScheduledSeq, SchedulerOutput


@dataclass
class SchedulerStats:
    """The scheduler's and its KV-cache manager's counters (the engine's only view of the pool)."""
    num_running: int
    num_waiting: int
    num_preemptions: int
    kv_total_blocks: int
    kv_used_blocks: int
    kv_free_blocks: int
    kv_cached_blocks: int  # indexed in the prefix cache, held or free
    kv_peak_blocks: int  # most blocks held at once since start or `reset_kv_peak`
    block_size: int
    prefix_caching: bool
    prefix_cache_queries: int
    prefix_cache_hits: int
    queue_time_s: float = 0.0  # summed over requests: arrival -> first scheduled (vLLM's WAITING phase)
    num_first_scheduled: int = 0  # requests scheduled for the first time (what queue_time_s sums over)


class Scheduler:
    def __init__(self, cfg: EngineConfig, num_blocks: int, num_lookahead: int = 0):
        """`num_blocks`: how many blocks the runner's KV tensors hold (the runner sizes them)."""
        self.cfg = cfg
        self.kv = KVCacheManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.num_lookahead = num_lookahead  # slots a draft model writes past the scheduled tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.queue_time_s, self.num_first_scheduled = 0.0, 0
        self.kv_peak_blocks = 0

    def stats(self) -> SchedulerStats:
        kv = self.kv
        return SchedulerStats(
            num_running=len(self.running), num_waiting=len(self.waiting), num_preemptions=self.num_preemptions,
            kv_total_blocks=kv.num_blocks, kv_used_blocks=kv.num_used, kv_free_blocks=kv.num_free,
            kv_cached_blocks=kv.num_cached, kv_peak_blocks=self.kv_peak_blocks, block_size=kv.block_size,
            prefix_caching=kv.enable_caching, prefix_cache_queries=kv.queries, prefix_cache_hits=kv.hits,
            queue_time_s=self.queue_time_s, num_first_scheduled=self.num_first_scheduled)

    def reset_kv_peak(self) -> None:
        self.kv_peak_blocks = self.kv.num_used

    def ref_counts(self, blocks: list[int]) -> list[int]:
        """How many requests hold each block (for `inferlab trace`)."""
        return [self.kv.pool.ref_count[b] for b in blocks]

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- before the forward ---------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        queries, hits = self.kv.queries, self.kv.hits
        self._schedule(out)
        out.prefix_cache_queries, out.prefix_cache_hits = self.kv.queries - queries, self.kv.hits - hits
        self.kv_peak_blocks = max(self.kv_peak_blocks, self.kv.num_used)
        for req, n in out.scheduled:
            start = req.num_computed_tokens
            d = out.spec_tokens.get(req.request_id, [])
            end = start + n - len(d)
            out.seqs.append(ScheduledSeq(req, req.tokens(start, end) + d, start, req.block_table,
                                         end == req.num_tokens, d))
        return out

    def _schedule(self, out: SchedulerOutput) -> None:
        budget = self.cfg.max_num_batched_tokens
        chunked = self.cfg.enable_chunked_prefill
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            drafts = req.spec_token_ids if req.num_new_tokens == 1 else []
            n = min(req.num_new_tokens + len(drafts), budget)
            if not chunked and n < req.num_new_tokens:
                i += 1
                continue  # waits for a step with room for the whole prompt
            if not self._grow(req, n, out):
                break  # req itself was preempted: everyone after it already was
            out.scheduled.append((req, n))
            if n > req.num_new_tokens:
                out.spec_tokens[req.request_id] = drafts[:n - req.num_new_tokens]
            budget -= n
            i += 1
        if out.preempted:
            return
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            hit, num_hit = self.kv.get_computed_blocks(req)
            n = min(req.num_tokens - num_hit, budget)
            if not chunked and n < req.num_tokens - num_hit:
                break
            if not self.kv.allocate_slots(req, n, hit, self._lookahead(req, num_hit + n)):
                break
            self.waiting.popleft()
            req.num_computed_tokens = req.num_cached_tokens = num_hit
            req.status = Status.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
                self.queue_time_s += req.first_scheduled_time - req.arrival_time
                self.num_first_scheduled += 1
            self.running.append(req)
            out.scheduled.append((req, n))
            out.prefix_hits[req.request_id] = num_hit
            budget -= n

    def _lookahead(self, req: Request, end: int) -> int:
        """Lookahead slots past token `end`, never past the longest the request can get."""
        return max(0, min(self.num_lookahead, req.num_tokens + req.num_tokens_left - end))

    def _grow(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        """Give `req` blocks for `n` more tokens, preempting from the back. False if req was preempted."""
        lookahead = self._lookahead(req, req.num_computed_tokens + n)
        while not self.kv.allocate_slots(req, n, lookahead=lookahead):
            victim = self.running.pop()
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        self.kv.free(req)  # its full blocks stay cached: on re-admission it may find them again
        req.num_computed_tokens = 0
        req.spec_token_ids, req.spec_probs = [], None
        req.status = Status.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # ---- after the forward ----------------------------------------------------------
    def update_from_output(self, sched: SchedulerOutput, num_accepted: dict[str, int],
                           drafts: dict) -> list[Request]:
        """Commit a step whose new tokens the output processor has already appended (and cut at
        any stop). Returns the requests that finished, their blocks released."""
        finished = []
        for req, n in sched.scheduled:
            req.num_computed_tokens += n
            num_spec = len(sched.spec_tokens.get(req.request_id, ()))
            if num_spec or self.num_lookahead or req.num_computed_tokens > req.num_tokens:
                self.kv.rollback(req, num_spec - num_accepted.get(req.request_id, 0))
            self.kv.cache_full_blocks(req)
            if req.is_finished:
                self.finish(req)
                finished.append(req)
            else:
                d = drafts.get(req.request_id)
                req.spec_token_ids, req.spec_probs = (d.token_ids, d.probs) if d else ([], None)
        return finished

    def finish(self, req: Request) -> None:
        """Release a finished (or aborted) request's blocks and forget it."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM's semantics: fails while blocks are held, unless running requests are preempted first."""
        if reset_running_requests:
            while self.running:
                self._preempt(self.running.pop())
        return self.kv.reset_prefix_cache()
