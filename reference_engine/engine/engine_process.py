"""The engine core in a process of its own: `ProcessAsyncEngine`, what `inferlab serve` runs by default.

vLLM serves the same way (vllm/v1/engine/core.py, `EngineCoreProc`: a busy loop in its own process;
the API server talks to it over ZMQ). Here the channel is two one-way pipes
(`multiprocessing.Pipe`): the front end sends batches of typed messages (messages.py: `AddRequest`,
`AbortRequest`, `Call`); the core (engine_core.py, the same loop `AsyncEngine` runs in a thread)
answers once per loop turn with one `TurnOutput` that carries every delta of the step, its counters
and any replies. What does not depend on the channel (streams, validation, calls, turns, death) is
`EngineClient`'s (client.py). The front end reads the pipe on the
event loop (`loop.add_reader`), so no thread of the HTTP process ever competes with the model for
the GIL; sends go through one sender thread, so the event loop never blocks on a full pipe (two
processes each writing to a full pipe would deadlock). Control calls (`memory_report`,
`reset_prefix_cache`) are awaited too: their replies come in a later `TurnOutput`, so streams keep
flowing while one waits, and a core that never answers costs the caller a timeout, not the server.

Why a process and not the thread of `AsyncEngine`: in one interpreter the engine thread must take
the GIL back after every torch op (a decode step of SmolLM2 is ~2,000 of them), and each time the
event loop holds it (writing SSE events, parsing requests) the step waits;
docs/perf/2026-12-02-served-decode-profile.md measures both modes against each other.

The core's life, as the front end sees it (docs/architecture.md draws it):
- start: fork (no re-import of torch) when that is safe, else spawn (`start_method`); the core
  loads the model and sends its facts. No facts within INFERLAB_ENGINE_READY_TIMEOUT_S (default
  600 s, vLLM's VLLM_ENGINE_READY_TIMEOUT_S) or `abort_start()` (a signal during start-up): the
  child is killed and `start()` raises.
- serving: one `TurnOutput` per step. The step watchdog declares a core that sends nothing for
  `step_timeout` seconds while work is pending dead (default: 20x the longest step seen, at least
  60 s); the core is then killed: a stopped or deadlocked process is as dead as an exited one.
- death (exit, kill -9, OOM, watchdog): every open stream ends with a RuntimeError naming the cause,
  pending calls fail, `is_alive` turns False (/health 503) and `on_death(why)` runs (`inferlab serve`
  exits non-zero then, as vLLM's API server does, unless --keep-alive-on-engine-death).
- stop: `shutdown()` sends "stop" (the core aborts what it holds and exits), waits `STOP_S`, then
  kills. A front end that never awaits `shutdown()` still leaves no core behind: the core dies with
  its parent (engine_core.die_with_parent), and interpreter exit kills it before multiprocessing's
  own exit hook would wait on it.

Invariants: the core is only touched in the child; streams only on the event loop; every stream
ends with one finished delta, the error of its step, or (when the core dies) a RuntimeError naming
it, after which `is_alive` is False. Ops are applied in the order sent.
"""
from __future__ import annotations

import asyncio
import atexit
import functools
import multiprocessing
import os
import queue
import threading
import time

import reference_engine
from reference_engine.config import EngineConfig
from reference_engine.engine.client import EngineClient, StartAborted
from reference_engine.engine.engine_core import core_main
from reference_engine.engine.messages import Call, CoreFacts, Frames, TurnOutput

READY_TIMEOUT_S = float(os.environ.get("INFERLAB_ENGINE_READY_TIMEOUT_S", 600))
WATCHDOG_FLOOR_S, WATCHDOG_STEPS = 60.0, 20  # default step timeout: max(floor, steps x longest step)
STOP_S = 5.0  # a stopping core ends its step and exits; after this it is killed


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1  # not Linux: no way to tell


def start_method() -> str:
    """"fork" (no re-import of torch) only while this process runs no more threads than it did
    right after `import torch`, counted when the reference_engine package first imported torch; else
    "spawn". A forked child inherits the memory of threads that do not exist in it: OpenMP's pool,
    started by a multi-threaded torch op, hangs the child's first parallel region. When torch was
    imported before this package, ops may already have run, so nothing proves fork safe: spawn.
    INFERLAB_ENGINE_START = fork | spawn | forkserver decides instead."""
    base = reference_engine.THREADS_AFTER_TORCH
    safe = base is not None and 0 < _threads() <= base
    return os.environ.get("INFERLAB_ENGINE_START") or ("fork" if safe else "spawn")


class ProcessAsyncEngine(EngineClient):
    """The `EngineClient` API with the core in a child process (module docstring). `step_timeout`:
    seconds without a step while work is pending before the core is declared dead (None: adaptive);
    `on_death(why)`: called on the event loop once the core died other than by `shutdown()`."""

    DEATH = "the engine process died"

    def __init__(self, config: EngineConfig, step_timeout: float | None = None, on_death=None,
                 cpus: tuple[int, ...] | None = None):
        super().__init__(config, on_death)
        self.cpus = cpus  # the core process's CPU affinity (None: the front end's)
        if step_timeout is not None and not step_timeout > 0:
            raise ValueError(f"step_timeout must be > 0 seconds, got {step_timeout}")
        self.step_timeout = step_timeout
        self._proc = None
        self._outq: queue.SimpleQueue = queue.SimpleQueue()
        self._longest_step, self._progress = 0.0, time.monotonic()
        self._method = None

    @property
    def core_pid(self) -> int | None:
        return self.facts.pid if self.facts is not None else None

    # ---- start and stop -------------------------------------------------------------
    async def start(self) -> "ProcessAsyncEngine":
        if self._proc is not None:
            return self
        method = start_method()
        ctx = multiprocessing.get_context(method)
        to_core_r, to_core_w = ctx.Pipe(duplex=False)
        from_core_r, from_core_w = ctx.Pipe(duplex=False)
        parent = None if method == "forkserver" else os.getpid()
        proc = ctx.Process(target=core_main, name="inferlab-engine-core", daemon=True,
                           args=(self.config, to_core_r, from_core_w, (to_core_w, from_core_r), parent, self.cpus))
        loop, aborted = asyncio.get_running_loop(), asyncio.Event()
        self._starting = (loop, aborted)
        try:
            proc.start()
            to_core_r.close()
            from_core_w.close()
            facts = await self._facts(proc, from_core_r, aborted)
        except BaseException:
            _kill(proc)
            to_core_w.close()
            from_core_r.close()
            raise
        finally:
            self._starting = None
        self._started_with(facts)
        self._proc, self._w, self._r, self._method = proc, to_core_w, from_core_r, method
        # Runs before multiprocessing's exit hook (registered earlier, so run later), which would wait on a live core.
        self._at_exit = functools.partial(_kill, proc)
        atexit.register(self._at_exit)
        self._aloop = loop
        self._frames = Frames(self._r.fileno())
        self._aloop.add_reader(self._r.fileno(), self._on_readable)
        self._sender = threading.Thread(target=self._send_loop, name="inferlab-engine-send", daemon=True)
        self._sender.start()
        self._watch()
        return self

    async def _facts(self, proc, conn, aborted: asyncio.Event) -> CoreFacts:
        """The core's start-up facts; raises its start-up error, StartAborted or RuntimeError."""
        got = asyncio.ensure_future(asyncio.to_thread(_recv, conn))
        stop = asyncio.ensure_future(aborted.wait())
        done, _ = await asyncio.wait({got, stop}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if got not in done:
            _kill(proc)  # the reader thread then sees EOF and ends
            await asyncio.wait({got})
            if aborted.is_set():
                raise StartAborted("engine start-up aborted (a signal came during start-up)")
            raise RuntimeError(f"the engine process sent nothing within {READY_TIMEOUT_S:.0f} s of starting "
                               "(INFERLAB_ENGINE_READY_TIMEOUT_S); it was killed")
        facts = got.result()
        if facts is None:
            await asyncio.to_thread(proc.join, STOP_S)
            facts = RuntimeError(f"the engine process exited during start-up (exit code {proc.exitcode})")
        if isinstance(facts, BaseException):
            raise facts
        return facts

    async def shutdown(self) -> None:
        if self._proc is not None:
            self._stop = True
            if self._dead is None:
                self._outq.put([Call(next(self._calls), "stop")])
            await asyncio.to_thread(self._proc.join, STOP_S)
            _kill(self._proc)
            atexit.unregister(self._at_exit)
            self._close_channel()
            self._proc = None
        self._end_streams()

    @property
    def is_alive(self) -> bool:
        return self._proc is not None and self._dead is None and not self._stop and self._proc.is_alive()

    def effective_config(self) -> dict:
        return {**super().effective_config(), "engine_start": self._method, "step_timeout_s": self.step_timeout}

    def _call_timeout(self) -> float:
        return self.step_limit() + 1.0

    # ---- the step watchdog ----------------------------------------------------------
    def step_limit(self) -> float:
        """Seconds the core may go without a turn while work is pending."""
        return self.step_timeout or max(WATCHDOG_FLOOR_S, WATCHDOG_STEPS * self._longest_step)

    def _busy(self) -> bool:
        """Work the core owes: ops it has not applied, calls it has not answered, or open streams while its
        last turn still held requests. Open streams alone are not: a stream the core no longer holds a
        request for (its end never delivered) kept an idle server "busy", and the watchdog killed its core
        once it had sat idle past the limit (CI: "no step for 237.8 s while 1 requests were open")."""
        held = self.last_stats is None or self.last_stats.num_held > 0
        return bool(self._sent or self._pending or (self._streams and held))

    def _watch(self) -> None:
        if self._dead is not None or self._stop or self._proc is None:
            return
        quiet = time.monotonic() - self._progress
        if self._busy() and quiet > self.step_limit():
            _kill(self._proc)
            self._died(f"no step for {quiet:.1f} s while {len(self._streams)} requests were open: stuck "
                       f"(the step watchdog's limit is {self.step_limit():.1f} s)")
            return
        self._aloop.call_later(min(1.0, self.step_limit() / 4), self._watch)

    # ---- the channel ----------------------------------------------------------------
    def _send(self, batch: list) -> None:
        if not self._busy():
            self._progress = time.monotonic()  # idle until now: the watchdog's clock starts here
        self._outq.put(batch)

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
            messages, ended = self._frames.read()
        except OSError:
            messages, ended = [], True
        for out in messages:
            self._handle(out)
        if ended:
            self._died(f"exit code {self._proc.exitcode if self._proc else None}")

    def _handle(self, out: TurnOutput) -> None:
        self._progress = time.monotonic()
        self._longest_step = max(self._longest_step, out.step_s)
        super()._handle(out)

    def _on_dead(self) -> None:
        self._aloop.remove_reader(self._r.fileno())

    def _close_channel(self) -> None:
        if self._dead is None:
            self._aloop.remove_reader(self._r.fileno())
        self._outq.put(None)
        self._sender.join(5)
        self._w.close()
        self._r.close()


def _recv(conn):
    """The core's first message, or None when it exited without one."""
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


def _kill(proc) -> None:
    """SIGKILL (a stopped or stuck process too) and reap; nothing if it has exited."""
    if proc.pid is not None and proc.exitcode is None:
        proc.kill()
        proc.join(STOP_S)
