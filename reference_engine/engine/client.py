"""The async front end's interface, `EngineClient`, and everything its two implementations share.

`AsyncEngine` (async_engine.py) runs the core in a thread of this process; `ProcessAsyncEngine`
(engine_process.py) runs it in a child process. Both speak messages.py to the same core loop
(engine_core.run), so this class holds what does not depend on where the core runs:

- requests: `add_request` validates on the event loop (`InputProcessor`, from the facts the core sent
  at start), registers the request's stream, and sends an `AddRequest`; `abort` sends an `AbortRequest`;
- calls: `call(name, *args)` runs `LLMEngine.<name>` in the core between two steps and awaits its reply,
  which comes in a later `TurnOutput` (streams keep flowing meanwhile);
- turns: `_handle(TurnOutput)` forgets the ops the core applied, keeps its counters, answers calls and
  puts each delta on its stream;
- death: `_died(why)` ends every open stream and call with the cause and runs `on_death`.

A subclass provides the channel: `start()`, `shutdown()`, `is_alive` and `_send(batch)`.

Invariants: streams are only touched on the event loop; every stream ends with exactly one delta whose
`finished` is True (finish_reason "abort" when aborted), the exception that broke its step, or, when
the core dies, a RuntimeError naming the cause. A turn after which the core holds no request and has
applied every op sent ends whatever stream is still open with an error (a lost end, named on stderr),
so no client waits forever on a request the core no longer has.
"""
from __future__ import annotations

import asyncio
import collections
import copy
import itertools
import sys
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from reference_engine.config import EngineConfig
from reference_engine.engine.input_processor import InputProcessor
from reference_engine.engine.messages import AbortRequest, AddRequest, Call, CoreFacts, EngineStats, TurnOutput
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


class StartAborted(Exception):
    """`start()` was abandoned by `abort_start()` (a signal during start-up)."""


class EngineClient:
    """The front end's API (module docstring). `on_death(why)`: called on the event loop once the core
    died other than by `shutdown()`."""

    DEATH = "the engine core died"  # how a stream's error names the core's death

    def __init__(self, config: EngineConfig, on_death: Callable[[str], None] | None = None):
        self.config = config
        self.on_death = on_death
        self.facts: CoreFacts | None = None  # what the core sent when it started
        self.last_stats: EngineStats | None = None  # the core's counters after its last turn
        self.processor: InputProcessor | None = None
        self.tokenizer = None
        self._starting: tuple | None = None  # (loop, aborted) while start() waits for the core
        self._streams: dict[str, RequestStream] = {}
        self._sent: collections.deque = collections.deque()  # ops sent, not yet applied by the core
        self._applied = 0
        self._pending: dict[int, asyncio.Future] = {}  # control calls awaiting the core's reply
        self._calls = itertools.count()
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._stop = False
        self._dead: str | None = None

    # ---- what a channel provides -----------------------------------------------------
    async def start(self) -> "EngineClient":
        raise NotImplementedError

    async def shutdown(self) -> None:
        raise NotImplementedError

    @property
    def is_alive(self) -> bool:
        raise NotImplementedError

    def _send(self, batch: list) -> None:
        raise NotImplementedError

    def _call_timeout(self) -> float | None:
        """Seconds a call may wait for its reply (None: no limit)."""
        return None

    # ---- start ------------------------------------------------------------------------
    def abort_start(self) -> None:
        """Abandon a `start()` in progress (safe from a signal handler): it raises StartAborted."""
        if self._starting is not None:
            loop, aborted = self._starting
            loop.call_soon_threadsafe(aborted.set)

    def _started_with(self, facts: CoreFacts) -> None:
        from reference_engine.tokenizer.tokenizer import Tokenizer

        self.facts, self.last_stats, self.config = facts, facts.stats, facts.cfg
        self.processor = InputProcessor.of(facts.cfg, facts.model_config.vocab_size, facts.max_model_len,
                                           facts.kv_capacity_tokens)
        self.tokenizer = Tokenizer(facts.cfg.model)
        self._sent.clear()
        self._applied, self._stop, self._dead = 0, False, None

    def _end_streams(self) -> None:
        """On shutdown: every open stream ends as aborted, every pending call fails."""
        self._fail_calls(RuntimeError("the engine was shut down"))
        for rid, stream in list(self._streams.items()):
            stream.queue.put_nowait(TokenDelta(rid, [], "", finished=True, finish_reason="abort"))
        self._streams.clear()

    # ---- facts ------------------------------------------------------------------------
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

    def effective_config(self) -> dict:
        """The settings the engine runs with, read back from its parts (`LLMEngine.effective_config`) when
        the core started, plus the front end's own."""
        return dict(self._started().effective)

    def stats(self) -> EngineStats:
        """The core's counters after its last turn; requests sent but not yet applied count as waiting."""
        self._started()
        s = copy.copy(self.last_stats)
        s.num_waiting += sum(1 for op in self._sent if isinstance(op, AddRequest))
        return s

    def _started(self) -> CoreFacts:
        if self.facts is None:
            raise RuntimeError(f"{type(self).__name__}.start() has not been awaited")
        return self.facts

    # ---- calls into the core -----------------------------------------------------------
    async def memory_report(self) -> dict[str, int]:
        """Bytes: weights, KV allocated and peak used, and device readings (`LLMEngine.memory_report`),
        read between two steps (the event loop keeps serving)."""
        return await self.call("memory_report")

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """`LLMEngine.reset_prefix_cache` between two steps. False while requests hold blocks, as in vLLM."""
        return await self.call("reset_prefix_cache", reset_running_requests)

    async def call(self, name: str, *args) -> Any:
        """`LLMEngine.<name>(*args)` in the core, between two steps. RuntimeError once the core is gone;
        TimeoutError after `_call_timeout()`."""
        if not self.is_alive:
            raise RuntimeError(f"the engine is not running ({self._dead or 'stopped'})")
        cid = next(self._calls)
        self._pending[cid] = fut = self._aloop.create_future()
        self._send([Call(cid, name, args)])
        limit = self._call_timeout()
        try:
            value = await asyncio.wait_for(asyncio.shield(fut), limit)
        except TimeoutError:
            raise TimeoutError(f"the engine core did not answer {name} within {limit:.0f} s") from None
        finally:
            self._pending.pop(cid, None)
        if isinstance(value, BaseException):
            raise value
        return value

    # ---- requests -----------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams,
                    request_id: str | None = None, cache_salt: str | None = None) -> RequestStream:
        """Validate now (ValueError on bad input), queue for the next step, return the stream."""
        self._started()
        if not self.is_alive:
            raise RuntimeError(f"the engine is not running ({self._dead or 'stopped'})")
        prompt_token_ids = list(prompt_token_ids)
        self.processor.validate(prompt_token_ids, params)
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

    def holds(self, request_id: str) -> bool:
        """Whether a stream of this id is open here."""
        return request_id in self._streams

    def abort(self, request_id: str) -> None:
        if request_id in self._streams:
            self._queue(AbortRequest(request_id))

    def _queue(self, op: AddRequest | AbortRequest) -> None:
        self._send([op])
        self._sent.append(op)

    # ---- turns, on the event loop ---------------------------------------------------------
    def _handle(self, out: TurnOutput) -> None:
        for _ in range(out.applied - self._applied):
            self._sent.popleft()
        self._applied = out.applied
        self.last_stats = out.stats
        for cid, value in out.replies.items():
            fut = self._pending.get(cid)
            if fut is not None and not fut.done():
                fut.set_result(value)
        if out.deltas:
            self._deliver(out.deltas)
        if self._streams and not self._sent and out.stats.num_held == 0 and not out.failure:
            lost = list(self._streams)  # the core applied every add and holds nothing: these ends were lost
            print(f"inferlab engine: {len(lost)} stream(s) outlived their requests ({', '.join(lost[:5])}); "
                  "ending them with an error", file=sys.stderr, flush=True)
            self._deliver([(rid, RuntimeError(f"the engine lost request {rid!r} without ending it"))
                           for rid in lost])
        if out.failure:
            self._died(out.failure)

    def _deliver(self, out: list[tuple[str, TokenDelta | BaseException]]) -> None:
        """Each item to its stream; a finished delta or an error ends the stream."""
        for rid, item in out:
            stream = self._streams.get(rid)
            if stream is None:
                continue  # already ended (an abort that raced a finish)
            stream.queue.put_nowait(item)
            if isinstance(item, BaseException) or item.finished:
                del self._streams[rid]

    def _fail_calls(self, err: BaseException) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_result(err)

    def _died(self, why: str) -> None:
        """The core is gone: every open stream and pending call ends with the error; `is_alive` turns
        False (/health 503); `on_death` runs (unless shut down on purpose)."""
        if self._dead is not None:
            return
        self._dead = why
        self._on_dead()
        if self._stop:
            return  # shut down on purpose: `shutdown` ends the streams (finish_reason "abort")
        err = RuntimeError(f"{self.DEATH} ({why})")
        self._fail_calls(err)
        self._deliver([(rid, err) for rid in list(self._streams)])
        if self.on_death is not None:
            self.on_death(why)

    def _on_dead(self) -> None:
        """What the channel does first when the core is gone (stop reading it)."""
