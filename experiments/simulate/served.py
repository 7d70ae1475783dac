"""The simulated replica behind the harness's own `Engine` interface, on the harness's clock.

Under `experiments.running.clock.simulated()` the whole `inferlab run` path (load generator, warm-up, levels,
SLO search, requests.jsonl, manifest, report) drives this engine exactly as it drives a real one;
the step loop sleeps each step's predicted duration, so every stamp the harness records is
simulated time. A step's tokens are delivered at the step's end, as `AsyncEngine` delivers them;
requests that arrive during a step wait for the next one, as they do in the engine.

Invariant: the engine is named "<engine>-simulated" and its `EngineInfo` says simulated, profile and
(un)calibrated, so no table or plot can show its numbers as measured.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from adapters.base import Engine, EngineInfo, GenerationRequest, MemorySnapshot, TokenEvent
from experiments.running import clock
from experiments.simulate.replica import Replica
from experiments.simulate.served_overhead import request_delay


class SimulatedEngine(Engine):
    name = "simulated"

    def __init__(self, replica: Replica, label: str, lengths: dict[str, int] | None = None,
                 facts: dict[str, Any] | None = None):
        super().__init__(label, replica.shape.dtype, {})
        self.replica, self.label, self.lengths = replica, label, lengths or {}
        self.facts = facts or {}
        self.streams: dict[str, asyncio.Queue] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.prompt_tokens: dict[str, int] = {}
        self.unknown_lengths = 0  # requests with no EOS length given (lengths set): they ran to max_tokens

    @property
    def in_process(self) -> bool:
        return True

    async def start(self) -> EngineInfo:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._loop())
        r = self.replica
        cap = r.num_blocks * r.cfg.block_size
        eff = {"kv_capacity_tokens": cap, "kv_blocks": r.num_blocks, "block_size": r.cfg.block_size,
               "max_num_seqs": r.cfg.max_num_seqs, "max_num_batched_tokens": r.cfg.max_num_batched_tokens,
               "chunked_prefill": r.cfg.enable_chunked_prefill, "prefix_caching": r.cfg.enable_prefix_caching,
               "speculative": {"num_speculative_tokens": r.spec_k, "acceptance": r.accept} if r.spec_k else False,
               "simulated": True, "profile": r.profile.label, **self.facts}
        return EngineInfo(self.label, f"simulated ({r.profile.label})", self.model, r.shape.dtype,
                          kv_capacity_tokens=cap, block_size=r.cfg.block_size, knobs=dict(self.facts),
                          mode="simulated", pid=None, effective=eff,
                          memory={"kv_bytes_per_token": int(r.shape.kv_bytes_per_token)})

    async def _loop(self) -> None:
        r = self.replica
        while True:
            if not r.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            res = r.step()
            if res is None:  # work, but nothing schedulable (cannot happen with a sane budget): wait
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(res.duration_s)
            now = clock.now_ns()
            for e in res.emitted:
                q = self.streams.get(e.request_id)
                if q is None:
                    continue
                q.put_nowait(TokenEvent(e.request_id, [1] * e.n_tokens, "", now, e.finished, e.finish_reason,
                                        self.prompt_tokens.get(e.request_id) if e.finished else None,
                                        None))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        rid = request.request_id
        q: asyncio.Queue = asyncio.Queue()
        self.streams[rid] = q
        self.prompt_tokens[rid] = len(request.prompt_token_ids)
        max_tokens = request.sampling.max_tokens
        out_len = None if request.sampling.ignore_eos else self.lengths.get(rid)
        if out_len is None and self.lengths and not request.sampling.ignore_eos:
            self.unknown_lengths += 1
        delay = request_delay(self.replica.profile, self.replica.outstanding) if self.replica.served else 0.0
        if delay:
            await asyncio.sleep(delay)  # HTTP, template, the pipe: served_overhead.py
        self.replica.add(rid, request.prompt_token_ids, max_tokens, out_len, clock.now_s())
        self._wake.set()
        n = 0
        try:
            while True:
                ev = await q.get()
                n += len(ev.token_ids)
                if ev.finished:
                    ev.completion_tokens = n
                yield ev
                if ev.finished:
                    return
        finally:
            self.streams.pop(rid, None)
            self.prompt_tokens.pop(rid, None)

    async def abort(self, request_id: str) -> None:
        req = next((q for q in self.replica.sched.running + list(self.replica.sched.waiting)
                    if q.request_id == request_id), None)
        if req is not None:
            req.finish("abort")
            self.replica.sched.finish(req)

    async def reset_prefix_cache(self) -> bool:
        return self.replica.sched.reset_prefix_cache()

    async def snapshot(self) -> MemorySnapshot:
        r = self.replica
        kv, (drafts, draft_tokens, accepted) = r.sched.kv, r.spec
        return MemorySnapshot(clock.now_ns(), kv_used_tokens=kv.num_used * kv.block_size,
                              kv_capacity_tokens=kv.num_blocks * kv.block_size,
                              kv_usage=kv.num_used / max(1, kv.num_blocks), num_running=len(r.sched.running),
                              num_waiting=len(r.sched.waiting),
                              extra={"num_preemptions_total": r.sched.num_preemptions,
                                     "prefix_cache_queries": kv.queries, "prefix_cache_hits": kv.hits,
                                     "spec_decode_num_drafts": drafts, "spec_decode_num_draft_tokens": draft_tokens,
                                     "spec_decode_num_accepted_tokens": accepted})

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
