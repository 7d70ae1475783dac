"""A simulated engine for the harness's mechanism tests: in-process, on the harness's clock.

Under `experiments.running.clock.simulated()` its planted delays pass in simulated time, so the
times the harness records are exact and the same on any machine, however busy: a test can
require TTFT == the planted 20 ms to a nanosecond and no wall-clock bound is needed.
It follows the paced engine's schedule (tests/experiments/paced_engine.py: event k due at
start + ttft + k * period, `pattern` tokens per event) and its FIFO queue with `capacity`
servers (a planted saturation rate of capacity / service time), whose waits it counts as the
reference engine does (`snapshot().extra`: request_queue_time_s, arrival -> served, summed; no
preemptions). `sent` counts every request the engine was sent, so a test can check that nothing
but the workload reached it.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, AsyncIterator

from adapters.base import Engine, EngineInfo, GenerationRequest, MemorySnapshot, TokenEvent, check_options
from experiments.running import clock
from tests.experiments.paced_engine import schedule, timing, token_ids


class SimEngine(Engine):
    name = "sim"
    OPTIONS = {"ttft_ms", "period_ms", "pattern", "capacity", "kv_cache_tokens", "log_path"}
    last: "SimEngine | None" = None  # the latest instance, for tests that run it through `inferlab run`

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        self.ttft_ms, self.period_ms, self.pattern = timing(self.options)
        self.capacity = self.options.get("capacity")
        self.free_at: list[int] = []  # each server's scheduled finish (ns), with capacity
        self.sent: list[str] = []  # request ids in the order they reached the engine
        self.prompts: list[tuple[int, ...]] = []  # their prompts, in the same order
        self.truth: dict[str, list[tuple[int, int]]] = {}  # request id -> [(due_ns, n_tokens)]
        self.queued_s = 0.0  # arrival -> served, summed over requests (the engine's own queue counter)
        SimEngine.last = self

    async def start(self) -> EngineInfo:
        self.free_at = [0] * int(self.capacity or 0)
        return EngineInfo("sim", "1", os.path.basename(self.model), self.dtype,
                          kv_capacity_tokens=self.options.get("kv_cache_tokens"), block_size=16, knobs=self.options)

    def _start_ns(self, max_tokens: int) -> int:
        """When the request starts being served: now, or when the first of `capacity` servers frees."""
        now = clock.now_ns()
        if not self.free_at:
            return now
        i = min(range(len(self.free_at)), key=self.free_at.__getitem__)
        start = max(now, self.free_at[i])
        self.queued_s += (start - now) / 1e9
        self.free_at[i] = schedule(start, max_tokens, self.ttft_ms, self.period_ms, self.pattern)[-1][0]
        return start

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        rid, n_max = request.request_id, request.sampling.max_tokens
        self.sent.append(rid)
        self.prompts.append(tuple(request.prompt_token_ids))
        plan = schedule(self._start_ns(n_max), n_max, self.ttft_ms, self.period_ms, self.pattern)
        self.truth[rid] = plan
        pos = 0
        for k, (due, n) in enumerate(plan):
            await asyncio.sleep(max(0, due - clock.now_ns()) / 1e9)
            fin = k == len(plan) - 1
            yield TokenEvent(rid, token_ids(request.prompt_token_ids, pos, n), "", clock.now_ns(), fin,
                             "length" if fin else None, len(request.prompt_token_ids) if fin else None,
                             n_max if fin else None)
            pos += n

    async def abort(self, request_id: str) -> None:
        pass

    async def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(clock.now_ns(), kv_capacity_tokens=self.options.get("kv_cache_tokens"),
                              extra={"request_queue_time_s": self.queued_s, "num_preemptions_total": 0})

    async def stop(self) -> None:
        pass
