"""The load generator: closed loop (max concurrency) or open loop (seeded Poisson / gamma
arrivals at a rate; rate = inf sends everything at once).

Invariants (the light observer, issue point 11): per event the generator does one list
append of the event object — no parsing, no arithmetic; everything else happens once per
request when it finishes, and aggregation happens after the run. Multi-turn items are
sent only after the turn they follow has finished. The arrival schedule depends only on
(rate, burstiness, seed, number of chains), so every engine sees the same one.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import numpy as np

from adapters.base import Engine, GenerationRequest, SamplingConfig, TokenEvent
from experiments.running import clock
from experiments.workload.workloads import WorkItem


@dataclass
class Outcome:
    """One request as the client saw it. `events` are (recv_ns, n_tokens) of every event."""

    item: WorkItem
    send_ns: int
    events: list[tuple[int, int]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # as the engine reported them
    completion_tokens: int | None = None
    error: str | None = None
    wire: tuple[int | None, int | None] | None = None  # (sent_ns, headers_ns): TokenEvent.wire
    # when the load meant to send it: its arrival time (open loop), or the moment its worker's previous request
    # finished (closed loop). send_ns - due_ns is the client's lateness: a slow client, not a slow engine
    due_ns: int | None = None
    finished_ns: int | None = None  # when its finished event arrived (the next request of its worker is due then)

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_reason not in (None, "abort")


def chains(items: list[WorkItem]) -> list[list[WorkItem]]:
    """Group items into sequences that must run in order (multi-turn); others are alone."""
    out: list[list[WorkItem]] = []
    by_id: dict[str, list[WorkItem]] = {}
    for it in items:
        if it.after is not None and it.after in by_id:
            by_id[it.after].append(it)
            by_id[it.request_id] = by_id.pop(it.after)
        else:
            out.append([it])
            by_id[it.request_id] = out[-1]
    return out


def arrivals(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send offsets in seconds: the first at 0, then gamma(shape=b, scale=1/(rate*b)) gaps
    (Poisson when b = 1; burstier when b < 1). rate = inf -> all at 0."""
    if n == 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=n - 1)
    return [0.0] + np.cumsum(gaps).tolist()


def finalize(o: Outcome, evs: list[TokenEvent]) -> Outcome:
    """Fold the raw events into the outcome (once per request, after its last event)."""
    for ev in evs:
        if ev.token_ids:
            o.events.append((ev.recv_ns, len(ev.token_ids)))
            o.token_ids.extend(ev.token_ids)
        o.text += ev.text or ""
        if o.wire is None and ev.wire:
            o.wire = (ev.wire[0], ev.wire[1])
        if ev.finished:
            o.finished_ns = ev.recv_ns or None
            o.finish_reason = ev.finish_reason
            o.prompt_tokens, o.completion_tokens = ev.prompt_tokens, ev.completion_tokens
    if o.finish_reason is None and o.error is None:
        o.error = "stream ended without a finished event"
    return o


@contextlib.contextmanager
def frozen_gc():
    """Objects that exist before the load are moved out of the collector's reach (`gc.freeze`),
    so that a full collection during it walks only what the load allocates. In a big process
    (the harness inside pytest, hundreds of thousands of objects) a full collection otherwise
    pauses the client for milliseconds mid-stream. vLLM's server freezes its start-up objects
    for the same reason. No `gc.collect()` first: it cost 0.3 s per level in such a process,
    and garbage frozen with the rest is collected as usual once `gc.unfreeze()` returns it."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class LoadGenerator:
    """Sends `items` to `engine` under one load level; calls `on_done(outcome)` per request.

    The first failed request (an exception from the stream, e.g. the engine died) stops the
    level: no new request is sent and `self.failure` holds the reason."""

    def __init__(self, engine: Engine, sampling: dict[str, Any], on_done: Callable[[Outcome], None],
                 timeout_s: float | None = None):
        self.engine, self.sampling, self.on_done, self.timeout_s = engine, sampling, on_done, timeout_s
        self.failure: str | None = None
        self.sent = 0  # requests sent so far (a sustained level sends as many as fit in its time)
        self.first_send_ns: int | None = None
        self.last_done_ns: int | None = None
        self._t0 = 0.0

    async def _one(self, item: WorkItem, arrival_s: float, due_ns: int | None = None) -> Outcome:
        req = GenerationRequest(item.request_id, item.prompt_token_ids,
                                SamplingConfig(**self.sampling, max_tokens=item.output_len), arrival_s=arrival_s,
                                messages=item.messages)
        evs: list[TokenEvent] = []
        append = evs.append
        send = clock.now_ns()
        self.sent += 1
        if self.first_send_ns is None:
            self.first_send_ns = send
        o = Outcome(item, send, due_ns=due_ns)
        try:
            async with asyncio.timeout(self.timeout_s):
                async for ev in self.engine.generate(req):
                    append(ev)
        except TimeoutError:
            o.error = f"no finished event within {self.timeout_s:g} s (load.timeout_s)"
            try:
                await asyncio.wait_for(self.engine.abort(item.request_id), 10)
            except Exception:  # the run fails on this request anyway; its reason is the timeout
                pass
        except Exception as e:  # the engine's failure, recorded as the run's reason
            o.error = f"{type(e).__name__}: {e}".strip().splitlines()[0][:500] or type(e).__name__
        finalize(o, evs)
        self.last_done_ns = clock.now_ns()
        if not o.ok and self.failure is None:
            self.failure = f"request {item.request_id}: {o.error or 'finish_reason=' + str(o.finish_reason)}"
        self.on_done(o)
        return o

    async def _chain(self, chain: list[WorkItem], arrival_s: float, due_ns: int | None = None) -> int | None:
        """Send the chain's turns in order; the first is due at `due_ns`, each later one when the one before it
        finished. Returns when the last finished (its final event's receive time), for the next chain's due."""
        for it in chain:
            if self.failure is not None:
                return due_ns
            o = await self._one(it, arrival_s, due_ns)
            due_ns = o.finished_ns or clock.now_ns()
        return due_ns

    async def closed(self, work: list[list[WorkItem]], concurrency: int, until_s: float | None = None,
                     more: Callable[[int], Awaitable[list[list[WorkItem]]]] | None = None) -> None:
        """At most `concurrency` chains in flight. With `until_s`, no chain starts after that many seconds and
        `await more(n)` supplies n fresh chains whenever `work` runs out before then (a sustained level; it
        must not block the event loop, which stamps every token)."""
        queue = list(reversed(work))

        async def take() -> list[WorkItem] | None:
            if until_s is not None and clock.now_s() - self._t0 >= until_s:
                return None
            if not queue and more is not None and until_s is not None:
                queue.extend(reversed(await more(concurrency)))
            return queue.pop() if queue else None

        async def worker() -> None:
            due = clock.now_ns()
            while self.failure is None and (chain := await take()) is not None:
                due = await self._chain(chain, clock.now_s() - self._t0, due)

        with frozen_gc():
            self._t0 = clock.now_s()
            n = concurrency if more is not None and until_s is not None else min(concurrency, len(work))
            await asyncio.gather(*(worker() for _ in range(n)))

    async def open(self, work: list[list[WorkItem]], offsets: list[float], max_concurrency: int | None = None) -> None:
        """Arrivals at `offsets` (s from now); with `max_concurrency`, an arrival waits for one of
        that many slots, and its TTFT counts from when it is sent (as vllm bench serve does)."""
        with frozen_gc():
            await self._open(work, offsets, max_concurrency)

    async def _open(self, work: list[list[WorkItem]], offsets: list[float], max_concurrency: int | None) -> None:
        self._t0 = clock.now_s()
        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        t0_ns = clock.now_ns()

        async def later(chain: list[WorkItem], at: float) -> None:
            delay = self._t0 + at - clock.now_s()
            if delay > 0:
                await asyncio.sleep(delay)
            if slots is None:
                await self._chain(chain, at, t0_ns + int(at * 1e9))
                return
            async with slots:  # a capped arrival is due when it gets its slot, as its TTFT counts from then
                await self._chain(chain, at, max(t0_ns + int(at * 1e9), clock.now_ns()))

        await asyncio.gather(*(later(c, t) for c, t in zip(work, offsets)))
