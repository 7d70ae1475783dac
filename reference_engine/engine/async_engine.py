"""The asyncio front of the engine: many concurrent streams over one step loop.

The step loop runs in one dedicated thread for the engine's whole life (vLLM runs its
engine core as a busy loop in a process of its own; a thread is enough here, since torch
releases the GIL while the model runs and the event loop keeps serving HTTP). Between steps
it applies the adds and aborts the event loop queued, then runs `LLMEngine.step`, and hands
the step's deltas back to the event loop, which puts each on its request's queue.

Why one thread and not `asyncio.to_thread` per step: the default executor hands successive
steps to whichever of its threads is free, and every thread that enters an OpenMP region
gets a team of its own. Two teams on two cores measured 7-15 % slower per step than one
(docs/perf/cpu_vs_vllm.md). The core is built in the same thread (the thread count torch
sets there is that thread's).

Invariants: the core is only ever touched by the engine thread (and by `memory_report` /
`reset_prefix_cache` under the step lock); streams are only touched on the event loop; every stream ends with
exactly one delta whose `finished` is True (finish_reason "abort" when aborted), or with the
exception that broke the step.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import AsyncIterator

from reference_engine.config import EngineConfig
from reference_engine.engine.llm_engine import EngineStats, LLMEngine
from reference_engine.outputs import TokenDelta
from reference_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class AddRequest:
    """Event loop -> engine thread: queue a request that `LLMEngine.validate` has accepted."""
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str
    cache_salt: str | None = None


@dataclass(frozen=True)
class AbortRequest:
    """Event loop -> engine thread: abort a request (its stream ends with finish_reason "abort")."""
    request_id: str


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


class StartAborted(Exception):
    """`start()` was abandoned by `abort_start()` (a signal during start-up)."""


class AsyncEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.on_death = None  # called on the event loop with the reason when the step loop dies
        self._starting: tuple | None = None  # (loop, aborted) while start() waits for the core
        self.core: LLMEngine | None = None
        self._streams: dict[str, RequestStream] = {}
        self._ops: list[AddRequest | AbortRequest] = []  # queued by the event loop, taken by the engine thread
        self._ops_lock = threading.Lock()
        self._wake = threading.Event()
        self._delivered = threading.Event()  # the event loop has taken the last step's deltas
        self._stop = False
        self._thread: threading.Thread | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._step_lock = threading.Lock()  # held while the engine thread touches the core

    # ---- lifecycle ------------------------------------------------------------------
    async def start(self) -> "AsyncEngine":
        if self._thread is None:
            self._aloop = asyncio.get_running_loop()
            self._stop = False
            built: concurrent.futures.Future = concurrent.futures.Future()
            self._thread = threading.Thread(target=self._run, args=(built,), name="inferlab-engine", daemon=True)
            self._thread.start()
            aborted = asyncio.Event()
            self._starting = (self._aloop, aborted)
            try:
                waits = {asyncio.wrap_future(built), asyncio.ensure_future(aborted.wait())}
                done, rest = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for w in rest:
                    w.cancel()
                if not built.done():  # the loading thread cannot be interrupted: it is a daemon, left behind
                    self._stop = True
                    raise StartAborted("engine start-up aborted (a signal came during start-up)")
                built.result()  # the core's constructor error, if any, raises here
            except BaseException:
                self._thread = None
                raise
            finally:
                self._starting = None
            self.config = self.core.cfg  # as the engine resolved it (backends chosen for the device)
        return self

    def abort_start(self) -> None:
        """Abandon a `start()` in progress (safe from a signal handler): it raises StartAborted."""
        if self._starting is not None:
            loop, aborted = self._starting
            loop.call_soon_threadsafe(aborted.set)

    async def shutdown(self) -> None:
        if self._thread is not None:
            self._stop = True
            self._wake.set()
            await asyncio.to_thread(self._thread.join)  # the step in flight ends first
            self._thread = None
        if self.core is not None:  # the engine thread has ended: free what the streams held
            for rid in list(self.core.requests):
                self.core.abort(rid)
            self.core.close()  # the tensor-parallel workers, if any
        for rid, stream in list(self._streams.items()):
            stream.queue.put_nowait(TokenDelta(rid, [], "", finished=True, finish_reason="abort"))
        self._streams.clear()

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
        return self._thread is not None and self._thread.is_alive() and not self._stop

    def effective_config(self) -> dict:
        """The settings the engine runs with, read back from its parts (`LLMEngine.effective_config`)."""
        return self._started().effective_config()

    async def memory_report(self) -> dict[str, int]:
        """Bytes: weights, KV allocated and peak used, and device readings (`LLMEngine.memory_report`),
        read between two steps in a worker thread (the event loop keeps serving)."""
        return await self._between_steps(lambda core: core.memory_report())

    def stats(self) -> EngineStats:
        s = self._started().stats()
        with self._ops_lock:
            s.num_waiting += sum(1 for op in self._ops if isinstance(op, AddRequest))
        return s

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """`LLMEngine.reset_prefix_cache` between two steps. False while requests hold blocks, as in vLLM."""
        return await self._between_steps(lambda core: core.reset_prefix_cache(reset_running_requests))

    async def _between_steps(self, fn):
        """`fn(core)` under the step lock, in a worker thread: waiting for a running step to end must
        not stop the event loop (every stream would freeze for that step)."""
        core = self._started()

        def locked():
            with self._step_lock:
                return fn(core)
        return await asyncio.to_thread(locked)

    # ---- requests -------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams,
                    request_id: str | None = None, cache_salt: str | None = None) -> RequestStream:
        """Validate now (ValueError on bad input), queue for the next step, return the stream."""
        core = self._started()
        if not self.is_alive:
            raise RuntimeError("AsyncEngine.start() has not been awaited")
        prompt_token_ids = list(prompt_token_ids)
        core.validate(prompt_token_ids, params)
        rid = request_id if request_id is not None else uuid.uuid4().hex
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in use")
        stream = RequestStream(rid)
        self._streams[rid] = stream
        self._queue(AddRequest(prompt_token_ids, params, rid, cache_salt))
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
            self._queue(AbortRequest(request_id))

    # ---- the loop: event-loop side --------------------------------------------------
    def _started(self) -> LLMEngine:
        if self.core is None:
            raise RuntimeError("AsyncEngine.start() has not been awaited")
        return self.core

    def _queue(self, op: AddRequest | AbortRequest) -> None:
        with self._ops_lock:
            self._ops.append(op)
        self._wake.set()

    def _deliver(self, out: list[tuple[str, TokenDelta | BaseException]]) -> None:
        """On the event loop: each item to its stream; a finished delta or an error ends the stream."""
        for rid, item in out:
            stream = self._streams.get(rid)
            if stream is None:
                continue  # already ended (an abort that raced a finish)
            stream.queue.put_nowait(item)
            if isinstance(item, BaseException) or item.finished:
                del self._streams[rid]
        self._delivered.set()

    # ---- the loop: engine-thread side -----------------------------------------------
    def _run(self, built: concurrent.futures.Future) -> None:
        try:
            self.core = LLMEngine(self.config)
        except BaseException as e:
            built.set_exception(e)
            return
        built.set_result(None)
        core = self.core
        while not self._stop:
            with self._ops_lock:
                ops, self._ops = self._ops, []
                if not ops and not core.has_unfinished():
                    self._wake.clear()
            if not ops and not core.has_unfinished():
                self._wake.wait()
                continue
            with self._step_lock:
                out = self._apply(ops)
                if core.has_unfinished():
                    out += self._step()
            if core.failure:  # a tensor-parallel rank died: stop stepping; /health turns 503
                self._stop = True
                if self.on_death is not None:
                    self._aloop.call_soon_threadsafe(self.on_death, core.failure)
            if out:
                # Wait until the event loop has taken them, so that it gets the GIL once per step
                # (as with one to_thread call per step); without this, back-to-back steps of a
                # small model starved it and clients read tokens in bursts.
                self._delivered.clear()
                self._aloop.call_soon_threadsafe(self._deliver, out)
                while not self._delivered.wait(0.1) and not self._stop:
                    pass

    def _apply(self, ops: list[AddRequest | AbortRequest]) -> list[tuple[str, TokenDelta | BaseException]]:
        return apply_ops(self.core, ops)

    def _step(self) -> list[tuple[str, TokenDelta | BaseException]]:
        return step_or_fail(self.core)


def apply_ops(core: LLMEngine, ops: list[AddRequest | AbortRequest]) -> list[tuple[str, TokenDelta | BaseException]]:
    """Queue the adds (validated already, by `AsyncEngine.add_request`) and apply the aborts, between
    two steps; -> the deltas they end streams with (an abort's final delta, an add that still failed)."""
    out: list[tuple[str, TokenDelta | BaseException]] = []
    for op in ops:
        if isinstance(op, AddRequest):
            try:
                core.enqueue(op.prompt_token_ids, op.params, op.request_id, cache_salt=op.cache_salt)
            except Exception as e:  # anything that still fails ends this stream alone
                out.append((op.request_id, e))
        else:
            delta = core.abort(op.request_id)
            out.append((op.request_id, delta or TokenDelta(op.request_id, [], "", finished=True,
                                                           finish_reason="abort")))
    return out


def step_or_fail(core: LLMEngine) -> list[tuple[str, TokenDelta | BaseException]]:
    """One step's deltas; a step that raises fails the in-flight requests (aborted, blocks freed) and
    the engine keeps serving."""
    try:
        return [(d.request_id, d) for d in core.step()]
    except Exception as e:  # a bug in a step
        failed = []
        for rid in list(core.requests):
            core.abort(rid)
            failed.append((rid, RuntimeError(f"engine step failed: {e!r}")))
        return failed
