"""The harness's clock and event-loop runner, in one place so tests can swap both.

Every time the harness stamps (a request's send, a level's start, an arrival's due time)
comes from `now_ns()`, and every engine run goes through `run(coro)`. By default these are
`time.perf_counter_ns` (CLOCK_MONOTONIC, the clock the adapters stamp events with) and
`asyncio.run`. `simulated()` swaps in an event loop whose time only moves when every task
waits on a timer (it jumps to the next one): an engine that sleeps its planted delays on
that loop and stamps with `now_ns()` then produces exact, machine-independent timings, which
is how the tests check the load generator, the metrics and the SLO search without any
wall-clock bound (tests/experiments/sim_engine.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import selectors
import time
from typing import Any, Callable, Coroutine, Iterator

_now_ns: Callable[[], int] = time.perf_counter_ns
_run: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run


def now_ns() -> int:
    return _now_ns()


def now_s() -> float:
    return _now_ns() / 1e9


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return _run(coro)


class _JumpSelector(selectors.DefaultSelector):
    """A selector that never sleeps on a timer: real I/O (a thread's result, a pipe) is taken
    as it comes; when none is ready and the loop would sleep until its next timer, the
    simulated clock jumps there instead. With no timer at all it blocks on real I/O."""

    def __init__(self, loop: "SimulatedLoop"):
        super().__init__()
        self.loop = loop

    def select(self, timeout: float | None = None):
        ready = super().select(0 if timeout is not None else None)
        if not ready and timeout is not None and timeout > 0:
            self.loop.sim_time += timeout
        return ready


class SimulatedLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on simulated time (seconds from `start`): `asyncio.sleep(d)` returns at
    once with the clock d later, and the order of wake-ups is exactly the timers' order."""

    def __init__(self, start: float = 0.0) -> None:
        self.sim_time = start
        super().__init__(_JumpSelector(self))

    def time(self) -> float:
        return self.sim_time


@contextlib.contextmanager
def simulated() -> Iterator[None]:
    """Within the block, `run` uses a `SimulatedLoop` and `now_ns` reads its clock. One clock
    for the whole block: each run's loop starts where the previous one stopped (engines run
    one after another, so their stamps keep their order). Not thread-safe: meant for tests."""
    global _now_ns, _run
    epoch = [0.0]  # simulated seconds at the end of the last run

    def sim_ns() -> int:
        try:
            return round(asyncio.get_running_loop().time() * 1e9)
        except RuntimeError:
            return round(epoch[0] * 1e9)

    def run_simulated(coro: Coroutine[Any, Any, Any]) -> Any:
        loop = SimulatedLoop(epoch[0])
        try:
            with asyncio.Runner(loop_factory=lambda: loop) as runner:
                return runner.run(coro)
        finally:
            epoch[0] = loop.sim_time

    saved = _now_ns, _run
    _now_ns, _run = sim_ns, run_simulated
    try:
        yield
    finally:
        _now_ns, _run = saved
