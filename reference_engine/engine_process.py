"""The engine core in a process of its own: `ProcessAsyncEngine`, what `inferlab serve` runs by default.

vLLM serves the same way (vllm/v1/engine/core.py, `EngineCoreProc`: a busy loop in its own process;
the API server talks to it over ZMQ). Here the channel is two one-way pipes
(`multiprocessing.Pipe`): the front end sends batches of typed messages (`AddRequest`,
`AbortRequest`, `Call`); the core answers once per loop turn with one `TurnOutput` that carries
every delta of the step, its counters and any replies. The front end reads it on the event loop
(`loop.add_reader`), so no thread of the HTTP process ever competes with the model for the GIL;
sends go through one sender thread, so the event loop never blocks on a full pipe (two processes
each writing to a full pipe would deadlock).

Why a process and not the thread of `AsyncEngine`: in one interpreter the engine thread must take
the GIL back after every torch op (a decode step of SmolLM2 is ~2,000 of them), and each time the
event loop holds it (writing SSE events, parsing requests) the step waits;
docs/perf/2026-12-02-served-decode-profile.md measures both modes against each other: the process
wins with a core left to the front end (serve's default, cores - 1 threads); with every core given
to the engine's threads, the thread was ~10 % ahead on a quiet machine (no handshake here yet).

An idle core that gets a message waits up to 2 ms for the next one (10 ms in all) before it steps
(`_burst`): a burst of clients reaches the front end over a few milliseconds, and stepping the
first request alone makes the rest wait a whole prefill step. When the core went idle because
several requests finished within `WAVE_S` (a closed loop's wave: their clients send the next ones
together, some a step earlier than the rest), it waits for as many new requests as finished, at
most `WAVE_MAX_S`: 8 closed-loop streams on SmolLM2 split 1 + 7 at every wave without it, and
the seven waited for the one's prefill (docs/perf/2026-12-03-closed-loop-waves.md).

The child is forked from the server before the server has run any torch op (no OpenMP pool,
no tokenizer threads to inherit), so it starts without re-importing torch; `INFERLAB_ENGINE_START`
= "spawn" starts a fresh interpreter instead. A process that has started threads since this module
was imported (a multi-threaded torch op starts OpenMP's pool, and a child forked after it hangs in
its first parallel region) spawns instead (`start_method`).

Invariants: the core is only touched in the child; streams only on the event loop; every stream
ends with one finished delta, the error of its step, or (when the child dies) a RuntimeError
naming it, after which `is_alive` is False (`/health` answers 503). Ops are applied in the order sent.
"""
from __future__ import annotations

import asyncio
import collections
import copy
import gc
import itertools
import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from reference_engine.async_engine import AbortRequest, AddRequest, AsyncEngine, apply_ops, step_or_fail
from reference_engine.config import EngineConfig
from reference_engine.engine import EngineStats, LLMEngine
from reference_engine.outputs import TokenDelta


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: no way to tell, so assume nothing was started
        return _BASE_THREADS


_BASE_THREADS = 0
_BASE_THREADS = _threads()  # after `import torch` (reference_engine's imports): its own threads are harmless


def start_method() -> str:
    """"fork" (no re-import of torch) while this process runs no more threads than it did when this
    module was imported; "spawn" once it does: a forked child inherits the memory of threads that do
    not exist in it (OpenMP's pool after a multi-threaded torch op hangs the child's first parallel
    region). INFERLAB_ENGINE_START = fork | spawn | forkserver decides instead."""
    return os.environ.get("INFERLAB_ENGINE_START") or ("fork" if _threads() <= _BASE_THREADS else "spawn")


@dataclass(frozen=True)
class Call:
    """Front -> core: run `LLMEngine.<name>(*args)` between two steps and reply with its result
    ("stop": abort everything and exit)."""
    call_id: int
    name: str
    args: tuple = ()


@dataclass
class TurnOutput:
    """Core -> front, once per loop turn that did anything."""
    deltas: list[tuple[str, TokenDelta | BaseException]]
    stats: EngineStats
    applied: int  # ops applied since start (the front forgets that many of those it sent)
    replies: dict[int, Any] = field(default_factory=dict)  # call_id -> result or exception
    failure: str | None = None  # the core can no longer step (LLMEngine.failure, tensor parallel)


def _portable(e: BaseException) -> BaseException:
    """An exception that survives pickling (its type when it can, its repr otherwise)."""
    try:
        return pickle.loads(pickle.dumps(e))
    except Exception:
        return RuntimeError(repr(e))


def core_main(cfg: EngineConfig, inbox, outbox, front_ends: tuple) -> None:
    """The child: build the core, report its facts, then loop: take messages (block only when
    idle), apply them in order, step, send one `TurnOutput`. Exits on "stop" or when the front is gone."""
    for c in front_ends:  # forked: our copies of the front's ends, or EOF would never come
        c.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front drains requests on SIGINT/SIGTERM, then stops us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        core = LLMEngine(cfg)
    except BaseException as e:
        outbox.send(_portable(e))
        return
    # Everything built so far (torch, the model's modules, the kernels: ~300k objects for SmolLM2)
    # lives as long as the process: out of the cyclic GC's sight. A full pass over it took ~200 ms,
    # inside whatever step it lands in; rare (60 s of SmolLM2 steps in process saw none), but a
    # long-running server gets there. vLLM's EngineCore does the same after its start-up
    # (vllm/v1/engine/core.py, `freeze_gc_heap` in vllm/utils/gc_utils.py, 0.32).
    gc.collect()
    gc.freeze()
    outbox.send(SimpleNamespace(cfg=core.cfg, model_config=core.model_config, max_model_len=core.max_model_len,
                                kv_capacity_tokens=core.runner.kv_capacity_tokens, stats=core.stats(),
                                effective={**core.effective_config(), "gc_frozen_objects": gc.get_freeze_count()},
                                pid=os.getpid()))
    applied, running = 0, True
    finished: collections.deque = collections.deque()  # when each recent request finished
    try:
        while running:
            now = time.monotonic()
            while finished and finished[0] < now - WAVE_S:
                finished.popleft()
            batches = [] if core.has_unfinished() else _burst(inbox, expect=len(finished))
            while inbox.poll():
                batches.append(inbox.recv())
            out, replies = [], {}
            for msg in (m for b in batches for m in b):
                if isinstance(msg, Call):
                    running = running and msg.name != "stop"
                    replies[msg.call_id] = _reply(core, msg)
                else:
                    out += apply_ops(core, [msg])
                    applied += 1
            if running and core.has_unfinished():
                out += step_or_fail(core)
                done = time.monotonic()
                finished.extend(done for _, d in out if getattr(d, "finished", False))
            outbox.send(TurnOutput([(r, _portable(d) if isinstance(d, BaseException) else d) for r, d in out],
                                   core.stats(), applied, replies, getattr(core, "failure", None)))
            running = running and not getattr(core, "failure", None)  # a dead TP rank: nothing left to step
    except (EOFError, OSError):
        pass  # the front end is gone
    finally:
        if hasattr(core, "close"):
            core.close()


BURST_GAP_S, BURST_MAX_S = 0.002, 0.010
WAVE_S, WAVE_MAX_S = 0.100, 0.030


def _burst(inbox, expect: int = 0) -> list:
    """An idle core's first message, and whatever follows it within `BURST_GAP_S` of the previous
    one (at most `BURST_MAX_S` in all): requests that clients send together (a burst) reach the
    front end over a few milliseconds; stepping the first one alone would make the rest wait a
    whole prefill step. Costs an idle server's first request 2 ms. With `expect` > 1 (that many
    requests finished just before the core went idle: a closed loop's wave) it also waits, up to
    `WAVE_MAX_S` in all, until `expect` new requests have come."""
    batches = [inbox.recv()]
    adds = sum(isinstance(m, AddRequest) for m in batches[0])
    deadline = time.monotonic() + (WAVE_MAX_S if expect > 1 else BURST_MAX_S)
    while (left := deadline - time.monotonic()) > 0:
        if not inbox.poll(left if adds < expect else min(left, BURST_GAP_S)):
            break
        batches.append(inbox.recv())
        adds += sum(isinstance(m, AddRequest) for m in batches[-1])
    return batches


def _reply(core: LLMEngine, call: Call) -> Any:
    if call.name == "stop":
        for rid in list(core.requests):
            core.abort(rid)
        return None
    try:
        return getattr(core, call.name)(*call.args)
    except Exception as e:
        return _portable(e)


class CoreFacts:
    """What `AsyncEngine` reads from its core, answered in the front end: facts the core sent when
    it started, its counters after its last turn, and calls through the pipe."""

    validate = LLMEngine.validate  # the same checks, over the facts below (model_config, max_model_len, runner, cfg)

    def __init__(self, facts: SimpleNamespace, call):
        from reference_engine.tokenizer import Tokenizer

        self.cfg, self.model_config, self.max_model_len = facts.cfg, facts.model_config, facts.max_model_len
        self.runner = SimpleNamespace(kv_capacity_tokens=facts.kv_capacity_tokens)
        self.tokenizer = Tokenizer(facts.cfg.model)
        self.last_stats, self._effective, self.pid, self._call = facts.stats, facts.effective, facts.pid, call

    def effective_config(self) -> dict:
        return {**self._effective, "engine_process": True, "burst_wait_ms": BURST_GAP_S * 1e3,
                "wave_wait_max_ms": WAVE_MAX_S * 1e3}

    def stats(self) -> EngineStats:
        return copy.copy(self.last_stats)

    def memory_report(self) -> dict[str, int]:
        return self._call("memory_report")

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return self._call("reset_prefix_cache", reset_running_requests)


class ProcessAsyncEngine(AsyncEngine):
    """`AsyncEngine`'s API with the core in a child process (module docstring)."""

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        self._proc = None
        self._sent: collections.deque = collections.deque()  # ops sent, not yet applied by the core
        self._replies: dict[int, Any] = {}
        self._calls = itertools.count()
        self._outq: queue.SimpleQueue = queue.SimpleQueue()
        self._dead: str | None = None

    @property
    def core_pid(self) -> int | None:
        return self.core.pid if self.core is not None else None

    async def start(self) -> "ProcessAsyncEngine":
        if self._proc is not None:
            return self
        ctx = multiprocessing.get_context(start_method())
        to_core_r, to_core_w = ctx.Pipe(duplex=False)
        from_core_r, from_core_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=core_main, args=(self.config, to_core_r, from_core_w, (to_core_w, from_core_r)),
                           name="inferlab-engine-core", daemon=True)
        proc.start()
        to_core_r.close()
        from_core_w.close()
        try:
            facts = await asyncio.to_thread(from_core_r.recv)
        except EOFError:
            facts = RuntimeError(f"the engine process exited during start-up (exit code {proc.exitcode})")
        if isinstance(facts, BaseException):
            await asyncio.to_thread(proc.join, 10)
            to_core_w.close()
            from_core_r.close()
            raise facts
        self._proc, self._w, self._r, self._stop, self._dead, self._applied = proc, to_core_w, from_core_r, False, None, 0
        self.core = CoreFacts(facts, self._call)
        self.config = facts.cfg
        self._aloop = asyncio.get_running_loop()
        self._aloop.add_reader(self._r.fileno(), self._on_readable)
        self._sender = threading.Thread(target=self._send_loop, name="inferlab-engine-send", daemon=True)
        self._sender.start()
        return self

    async def shutdown(self) -> None:
        if self._proc is not None:
            self._stop = True
            if self._dead is None:
                self._outq.put([Call(next(self._calls), "stop")])
            await asyncio.to_thread(self._proc.join, 30)
            if self._proc.is_alive():
                self._proc.kill()
                await asyncio.to_thread(self._proc.join)
            self._close_channel()
            self._proc = None
        for rid, stream in list(self._streams.items()):
            stream.queue.put_nowait(TokenDelta(rid, [], "", finished=True, finish_reason="abort"))
        self._streams.clear()

    @property
    def is_alive(self) -> bool:
        return self._proc is not None and self._dead is None and not self._stop and self._proc.is_alive()

    def stats(self) -> EngineStats:
        s = self._started().stats()
        s.num_waiting += sum(1 for op in self._sent if isinstance(op, AddRequest))
        return s

    # ---- the channel ----------------------------------------------------------------
    def _queue(self, op: AddRequest | AbortRequest) -> None:
        self._sent.append(op)
        self._outq.put([op])

    def _send_loop(self) -> None:
        """Sender thread: everything queued since the last send goes as one message."""
        while True:
            batch = self._outq.get()
            if batch is None:
                return
            while not self._outq.empty():
                more = self._outq.get()
                if more is None:
                    self._outq.put(None)
                    break
                batch += more
            try:
                self._w.send(batch)
            except OSError:
                return  # the core is gone; the reader reports it

    def _on_readable(self) -> None:
        try:
            while self._r.poll():
                self._handle(self._r.recv())
        except (EOFError, OSError):
            self._died(f"exit code {self._proc.exitcode if self._proc else None}")

    def _handle(self, out: TurnOutput) -> None:
        for _ in range(out.applied - self._applied):
            self._sent.popleft()
        self._applied = out.applied
        self.core.last_stats = out.stats
        self._replies.update(out.replies)
        if out.deltas:
            self._deliver(out.deltas)
        if out.failure:
            self._died(out.failure)

    def _call(self, name: str, *args) -> Any:
        """A core method between two steps; blocks the event loop until the core's turn ends."""
        if not self.is_alive:
            raise RuntimeError(f"the engine process is not running ({self._dead or 'stopped'})")
        cid = next(self._calls)
        self._outq.put([Call(cid, name, args)])
        while cid not in self._replies:
            try:
                self._handle(self._r.recv())
            except (EOFError, OSError):
                self._died(f"exit code {self._proc.exitcode}")
                raise RuntimeError("the engine process died") from None
        value = self._replies.pop(cid)
        if isinstance(value, BaseException):
            raise value
        return value

    def _died(self, why: str) -> None:
        """The core is gone: every open stream ends with the error; /health turns 503."""
        if self._dead is not None:
            return
        self._dead = why
        self._aloop.remove_reader(self._r.fileno())
        if self._stop:
            return  # shut down on purpose: `shutdown` ends the streams (finish_reason "abort")
        err = RuntimeError(f"the engine process died ({why})")
        self._deliver([(rid, err) for rid in list(self._streams)])

    def _close_channel(self) -> None:
        if self._dead is None:
            self._aloop.remove_reader(self._r.fileno())
        self._outq.put(None)
        self._sender.join(5)
        self._w.close()
        self._r.close()
