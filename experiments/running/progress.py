"""Live progress (rich): finished requests and output tokens/s per engine and load level.

Shown only when stderr is a terminal; otherwise (CI, tests, pipes) every call is a no-op
apart from one plain line per level, so logs stay readable. Updated once per finished
request, never per token event.
"""
from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, enabled: bool | None = None):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._bar: Any = None
        self._task: Any = None
        self._tokens = 0
        self._t0 = 0.0

    def __enter__(self) -> "Progress":
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[tps]:>8.1f} tok/s"), TimeElapsedColumn(), transient=False,
                            refresh_per_second=2)  # the bar is client CPU too: keep it lazy
            self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()

    def level(self, label: str, total: int, seconds: float | None = None) -> None:
        """A level of `total` requests, or (`seconds`) one that sends fresh requests for that long."""
        self._tokens, self._t0 = 0, time.perf_counter()
        if self._bar is not None:
            self._task = self._bar.add_task(label, total=None if seconds else total, tps=0.0)
        else:
            what = f"fresh requests for {seconds:g} s" if seconds else f"{total} requests"
            print(f"inferlab: {label}: {what}", file=sys.stderr, flush=True)

    def done(self, n_tokens: int) -> None:
        if self._bar is None:
            return
        self._tokens += n_tokens
        dt = time.perf_counter() - self._t0
        self._bar.update(self._task, advance=1, tps=self._tokens / dt if dt > 0 else 0.0)

    def note(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(f"inferlab: {text}", file=sys.stderr, flush=True)
