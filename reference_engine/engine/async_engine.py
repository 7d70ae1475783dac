"""`AsyncEngine`: the engine core in one thread of this process, behind the `EngineClient` API.

The core loop (engine_core.run) runs in one dedicated thread for the engine's whole life: it takes the
batches the event loop queued on a `LocalInbox`, applies them, steps, and hands each `TurnOutput` to
the event loop, which puts each delta on its request's stream (client.py). `ProcessAsyncEngine`
(engine_process.py) runs the same loop in a child process instead; that is what `inferlab serve` runs
by default, since here the engine thread and the event loop share the GIL.

Why one thread and not `asyncio.to_thread` per step: the default executor hands successive steps to
whichever of its threads is free, and every thread that enters an OpenMP region gets a team of its
own. Two teams on two cores measured 7-15 % slower per step than one (docs/perf/cpu_vs_vllm.md). The
core is built in the same thread (the thread count torch sets there is that thread's).

The engine thread waits, after each turn it sends, until the event loop has taken it, so that the
event loop gets the GIL once per step (as with one to_thread call per step); without this, back-to-back
steps of a small model starved it and clients read tokens in bursts.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from reference_engine.engine.client import EngineClient, StartAborted
from reference_engine.engine.engine_core import thread_main
from reference_engine.engine.messages import Call, CoreFacts, LocalInbox, TurnOutput


class _ToLoop:
    """The engine thread's outbox: the first message settles `start()`; each turn goes to the event loop,
    and the thread waits until it has been handled."""

    def __init__(self, engine: "AsyncEngine", built: concurrent.futures.Future):
        self.engine, self.built = engine, built
        self.delivered = threading.Event()

    def send(self, msg) -> None:
        if not self.built.done():
            self.built.set_result(msg)
            return
        self.delivered.clear()
        try:
            self.engine._aloop.call_soon_threadsafe(self._handle, msg)
        except RuntimeError:  # the event loop is closed: nobody is listening
            return
        while not self.delivered.wait(0.1) and not self.engine._stop:
            pass

    def _handle(self, out: TurnOutput) -> None:
        try:
            self.engine._handle(out)
        finally:
            self.delivered.set()


class AsyncEngine(EngineClient):
    """The core in a thread (module docstring)."""

    def __init__(self, config, on_death=None):
        super().__init__(config, on_death)
        self._inbox: LocalInbox | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> "AsyncEngine":
        if self._thread is not None:
            return self
        self._aloop = asyncio.get_running_loop()
        built: concurrent.futures.Future = concurrent.futures.Future()
        inbox, aborted = LocalInbox(), asyncio.Event()
        thread = threading.Thread(target=thread_main, args=(self.config, inbox, _ToLoop(self, built)),
                                  name="inferlab-engine", daemon=True)
        thread.start()
        self._starting = (self._aloop, aborted)
        try:
            waits = {asyncio.wrap_future(built), asyncio.ensure_future(aborted.wait())}
            _, rest = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in rest:
                w.cancel()
            if not built.done():  # the loading thread cannot be interrupted: it is a daemon, left behind
                self._stop = True
                raise StartAborted("engine start-up aborted (a signal came during start-up)")
            facts = built.result()
        finally:
            self._starting = None
        if isinstance(facts, BaseException):
            raise facts  # the core's constructor error
        assert isinstance(facts, CoreFacts)
        self._started_with(facts)
        self._inbox, self._thread = inbox, thread
        return self

    @property
    def is_alive(self) -> bool:
        """True while the core loop runs (started and not crashed or shut down)."""
        return self._thread is not None and self._thread.is_alive() and not self._stop and self._dead is None

    async def shutdown(self) -> None:
        if self._thread is not None:
            if self._thread.is_alive():
                self._inbox.send([Call(next(self._calls), "stop")])
            self._stop = True  # the thread's outbox stops waiting on the event loop
            await asyncio.to_thread(self._thread.join)  # the step in flight ends first
            self._thread = None
        self._end_streams()

    def _send(self, batch: list) -> None:
        self._inbox.send(batch)
