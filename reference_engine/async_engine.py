"""The asyncio front of the engine: many concurrent streams over one step loop.

The step loop is a background task. Between steps it applies queued adds and aborts
(so the core is only ever touched by one thread at a time), then runs `LLMEngine.step`
in a worker thread — torch releases the GIL, so the event loop keeps serving HTTP
while the model runs — and hands each delta to its request's queue.

Invariant: every stream ends with exactly one delta whose `finished` is True
(finish_reason "abort" when aborted), or with the exception that broke the step.
"""
from __future__ import annotations

import asyncio
import threading
import uuid
from importlib import metadata
from pathlib import Path
from typing import AsyncIterator

from reference_engine.config import EngineConfig
from reference_engine.engine import EngineStats, LLMEngine
from reference_engine.outputs import TokenDelta
from reference_engine.sampling_params import SamplingParams


class RequestStream:
    """Async iterator over one request's deltas."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.queue: asyncio.Queue[TokenDelta | BaseException] = asyncio.Queue()
        self.finished = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> TokenDelta:
        if self.finished:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item


class AsyncEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.core: LLMEngine | None = None
        self._streams: dict[str, RequestStream] = {}
        self._ops: list[tuple] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._step_lock = threading.Lock()  # held while a step runs in the worker thread

    # ---- lifecycle ------------------------------------------------------------------
    async def start(self) -> "AsyncEngine":
        if self.core is None:
            self.core = await asyncio.to_thread(LLMEngine, self.config)
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._loop(), name="inferlab-step-loop")
        return self

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for rid in list(self._streams):
            self._apply_abort(rid)

    # ---- facts ----------------------------------------------------------------------
    @property
    def tokenizer(self):
        return self._started().tokenizer

    @property
    def max_model_len(self) -> int:
        return self._started().max_model_len

    @property
    def model_config(self):
        return self._started().model_config

    @property
    def model_name(self) -> str:
        return Path(self.config.model).name

    @property
    def version(self) -> str:
        try:
            return metadata.version("inferlab")
        except metadata.PackageNotFoundError:
            return "0.0.0+local"

    @property
    def is_alive(self) -> bool:
        """True while the step loop runs (started and not crashed or shut down)."""
        return self._task is not None and not self._task.done()

    def stats(self) -> EngineStats:
        s = self._started().stats()
        s.num_waiting += sum(1 for op in self._ops if op[0] == "add")
        return s

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """`LLMEngine.reset_prefix_cache` between two steps (waits for a running step to end, so it
        may block the event loop for one step). False while requests hold blocks, as in vLLM."""
        core = self._started()
        with self._step_lock:
            return core.reset_prefix_cache(reset_running_requests)

    # ---- requests -------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams,
                    request_id: str | None = None, cache_salt: str | None = None) -> RequestStream:
        """Validate now (ValueError on bad input), queue for the next step, return the stream."""
        core = self._started()
        if self._task is None:
            raise RuntimeError("AsyncEngine.start() has not been awaited")
        prompt_token_ids = list(prompt_token_ids)
        core.validate(prompt_token_ids, params)
        rid = request_id if request_id is not None else uuid.uuid4().hex
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in use")
        stream = RequestStream(rid)
        self._streams[rid] = stream
        self._ops.append(("add", prompt_token_ids, params, rid, cache_salt))
        self._wake.set()
        return stream

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams,
                       request_id: str | None = None, cache_salt: str | None = None) -> AsyncIterator[TokenDelta]:
        stream = self.add_request(prompt_token_ids, params, request_id, cache_salt)
        try:
            async for delta in stream:
                yield delta
        finally:
            if not stream.finished:  # consumer went away: free the request's blocks
                self.abort(stream.request_id)

    def abort(self, request_id: str) -> None:
        if request_id in self._streams:
            self._ops.append(("abort", request_id))
            if self._wake is not None:
                self._wake.set()

    # ---- the loop -------------------------------------------------------------------
    def _started(self) -> LLMEngine:
        if self.core is None:
            raise RuntimeError("AsyncEngine.start() has not been awaited")
        return self.core

    def _apply_abort(self, rid: str) -> None:
        delta = self.core.abort(rid) if self.core is not None else None
        stream = self._streams.pop(rid, None)
        if stream is not None:
            stream.queue.put_nowait(delta or TokenDelta(rid, [], "", finished=True, finish_reason="abort"))

    def _apply_ops(self) -> None:
        ops, self._ops = self._ops, []
        for op in ops:
            if op[0] == "add":
                _, ids, params, rid, salt = op
                if rid not in self._streams:
                    continue  # aborted before it was ever queued
                try:
                    self.core.add_request(ids, params, rid, cache_salt=salt)
                except ValueError as e:
                    self._streams.pop(rid).queue.put_nowait(e)
            else:
                self._apply_abort(op[1])

    def _step(self) -> list[TokenDelta]:
        with self._step_lock:
            return self.core.step()

    async def _loop(self) -> None:
        core = self.core
        while True:
            if not self._ops and not core.has_unfinished():
                self._wake.clear()
                await self._wake.wait()
            self._apply_ops()
            if not core.has_unfinished():
                continue
            try:
                deltas = await asyncio.to_thread(self._step)
            except Exception as e:  # a bug in a step: fail the in-flight requests, keep serving
                for rid in list(core.requests):
                    core.abort(rid)
                    stream = self._streams.pop(rid, None)
                    if stream is not None:
                        stream.queue.put_nowait(RuntimeError(f"engine step failed: {e!r}"))
                continue
            for d in deltas:
                stream = self._streams.get(d.request_id)
                if stream is None:
                    continue
                stream.queue.put_nowait(d)
                if d.finished:
                    del self._streams[d.request_id]
