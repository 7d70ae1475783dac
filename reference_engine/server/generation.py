"""Engine requests made on behalf of one HTTP request.

Invariants:
- every engine request a `Choices` adds ends finished or aborted when the HTTP request ends
  (normal end, error, client disconnect, cancellation): callers run `Choices.close()` in a finally;
- the `Gate` counts engine requests that have no token yet (queued or prefilling) and never
  lets that number pass `max_waiting`: over it the request is refused (503 + Retry-After)
  instead of the queue growing without bound;
- latency histograms are observed here, once per token-bearing delta.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from reference_engine.outputs import TokenDelta, TokenLogprob

from .errors import APIError, from_value_error

RETRY_AFTER_S = 1
SAMPLING_FIELDS = ("prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                    "presence_penalty", "frequency_penalty", "seed", "stop", "stop_token_ids", "logprobs",
                    "min_tokens")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class Gate:
    """Bounded admission: at most `limit` engine requests without a first token at once."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"max_waiting must be >= 1, got {limit}")
        self.limit, self.pending = limit, 0

    def check(self, k: int) -> None:
        """400 for a request that could never be admitted; called before its prompts are tokenized."""
        if k > self.limit:
            raise APIError(f"this request needs {k} sequences (prompts x n) but the server admits at most "
                           f"{self.limit} waiting sequences", 400, param="n")

    def reserve(self, k: int) -> None:
        self.check(k)
        if self.pending + k > self.limit:
            raise APIError(f"server busy: {self.pending} sequences already waiting (limit {self.limit}); "
                           "retry later", 503, code="overloaded", headers={"Retry-After": str(RETRY_AFTER_S)})
        self.pending += k

    def release(self, k: int = 1) -> None:
        self.pending -= k


@dataclass
class Choice:
    """What one engine request has produced so far."""

    index: int
    request_id: str
    prompt_ids: list[int]
    stream: Any = None
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    waiting: bool = True  # holds a Gate slot until its first token or its end
    t_last: float = 0.0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def child_params(params, j: int):
    """Choice j of n: a seeded request's child j gets seed + j (vLLM's parallel_sampling.py),
    so the n choices differ and each is reproducible alone."""
    return params if params.seed is None or j == 0 else replace(params, seed=params.seed + j)


class Choices:
    """One HTTP request's choices (not a step's batch): `len(prompts) * n` engine requests; choice index = prompt_index * n + j (vLLM's order).

    Raises APIError (400) if the engine rejects any of them; the ones already added are aborted;
    (503) if the engine's loop is no longer running.
    """

    def __init__(self, state, prompts: list[list[int]], params, n: int = 1, prefix: str = "cmpl",
                 cache_salt: str | None = None):
        self.state, self.id = state, new_id(prefix)
        self.t0 = time.perf_counter()
        self.num_prompt_tokens = sum(len(p) for p in prompts)  # usage counts each prompt once
        self.choices: list[Choice] = []
        total = len(prompts) * n
        if not state.engine.is_alive:  # its step loop died (e.g. a tensor-parallel rank was killed)
            raise APIError("the engine is not running; this server cannot serve requests any more", 503,
                           code="engine_dead")
        state.gate.reserve(total)
        try:
            for p, ids in enumerate(prompts):
                for j in range(n):
                    c = Choice(p * n + j, f"{self.id}-{p * n + j}", ids, t_last=self.t0)
                    c.stream = state.engine.add_request(ids, child_params(params, j), request_id=c.request_id,
                                                        cache_salt=cache_salt)
                    self.choices.append(c)
        except BaseException as err:
            state.gate.release(total - len(self.choices))  # slots of the requests never added
            self.close()
            if isinstance(err, ValueError):
                raise from_value_error(err, SAMPLING_FIELDS) from None
            raise

    @property
    def num_completion_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.choices)

    def _release(self, c: Choice) -> None:
        if c.waiting:
            c.waiting = False
            self.state.gate.release()

    def _record(self, c: Choice, d: TokenDelta) -> None:
        """Fold a delta into its choice and observe latencies (TTFT, ITL split over the delta's tokens, E2E)."""
        now, m = time.perf_counter(), self.state.metrics
        k = len(d.new_token_ids)
        if k:
            if not c.token_ids:
                m.ttft.observe(now - self.t0)
            else:
                for _ in range(k):
                    m.itl.observe((now - c.t_last) / k)
            c.t_last = now
            self._release(c)
        c.token_ids.extend(d.new_token_ids)
        c.text += d.text_delta
        if d.logprobs:
            c.logprobs.extend(d.logprobs)
        if d.finished:
            c.finish_reason, c.stop_reason = d.finish_reason or "stop", d.stop_reason
            self._release(c)
            m.e2e.observe(now - self.t0)
            m.finished(c.finish_reason)

    async def deltas(self) -> AsyncIterator[tuple[Choice, TokenDelta]]:
        """Yield (choice, delta) as deltas arrive from any request of the group; the choice is already updated."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(c: Choice) -> None:
            try:
                async for d in c.stream:
                    queue.put_nowait((c, d))
            except Exception as err:  # surface engine failures to the consumer, not the loop's log
                queue.put_nowait((c, err))
            finally:
                queue.put_nowait((c, None))  # end of this stream

        live = [c for c in self.choices if not c.finished]
        tasks = [asyncio.create_task(pump(c)) for c in live]
        try:
            ended = 0
            while ended < len(live):
                c, d = await queue.get()
                if d is None:
                    ended += 1
                    if not c.finished:  # a stream that stopped without its final delta counts as aborted
                        c.finish_reason = "abort"
                        self._release(c)
                elif isinstance(d, Exception):
                    raise d
                else:
                    self._record(c, d)
                    yield c, d
        finally:
            for t in tasks:
                t.cancel()

    async def run(self) -> list[Choice]:
        """Drive every request to its end (non-streaming responses)."""
        async for _ in self.deltas():
            pass
        return self.choices

    def close(self) -> None:
        """Abort whatever has not finished and return its Gate slots. Idempotent."""
        for c in self.choices:
            if not c.finished:
                self.state.engine.abort(c.request_id)
            self._release(c)


async def until_disconnect(request, coro):
    """Run `coro`; if the HTTP client goes away first, cancel it and return None.

    Non-streaming requests get no write to fail on, so this watches `receive()` for
    `http.disconnect` (the body has already been read by then).
    """
    work = asyncio.ensure_future(coro)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    done: set = set()
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
    return work.result() if work in done else None


async def run_whole(request, group: Choices) -> list[Choice] | None:
    """A non-streaming request: run the group to its end, or abort it when the client leaves
    (None). The group's requests are released either way."""
    try:
        return await until_disconnect(request, group.run())
    finally:
        group.close()
