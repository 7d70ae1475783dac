"""Memory sampling during a run, every ~100 ms, in a thread of its own.

Each sample: RSS of the engine's process tree (the engine's pid and all descendants; the
harness's own pid for an in-process engine) and GPU memory (NVML for the whole device when
pynvml is present, else torch.cuda for this process when torch is already imported and
sees a GPU). Every `engine_every`-th sample (default: every 0.5 s) also asks the engine for
its KV report (`engine.snapshot()`, run on the harness's event loop with a short timeout):
for a server that is an HTTP scrape of its metrics, which costs the client CPU, so it is
taken less often than the cheap process numbers.
Invariant: the sampler only reads; it never touches the engine's state.
"""
from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import pandas as pd
import psutil

from adapters.base import Engine


class ProcessTree:
    """RSS of a process and its descendants. Finding the descendants scans all of /proc in
    Python (milliseconds, holding the GIL), so the tree is rediscovered only every
    `refresh` calls; reading each known process's RSS is cheap."""

    def __init__(self, pid: int | None, refresh: int = 20):
        self.pid, self.refresh, self.calls = pid, refresh, 0
        self.procs: list[psutil.Process] = []

    def rss(self) -> int | None:
        if self.pid is None:  # an attached server: its process is not ours to see
            return None
        if self.calls % self.refresh == 0 or not self.procs:
            try:
                root = psutil.Process(self.pid)
                self.procs = [root] + root.children(recursive=True)
            except psutil.Error:
                return None
        self.calls += 1
        total, alive = 0, False
        for p in self.procs:
            try:
                total += p.memory_info().rss
                alive = True
            except psutil.Error:  # a process that just exited
                pass
        return total if alive else None


class _GPU:
    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.torch = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # no NVML: fall back to torch.cuda, or nothing
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available():
                self.torch = torch

    def used(self) -> int | None:
        if self.handles:
            return sum(int(self.nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self.handles)
        if self.torch is not None:
            return int(self.torch.cuda.memory_reserved())
        return None


class MemorySampler:
    def __init__(self, engine: Engine, pid: int | None, loop: asyncio.AbstractEventLoop, interval_s: float = 0.1,
                 engine_every: int = 5):
        self.engine, self.pid, self.loop, self.interval = engine, pid, loop, interval_s
        self.engine_every = engine_every
        self.samples: list[dict[str, Any]] = []
        self.marks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inferlab-memory", daemon=True)
        self._gpu = _GPU()
        self._tree = ProcessTree(pid)

    def start(self) -> "MemorySampler":
        self._thread.start()
        return self

    def mark(self, label: str) -> None:
        """Note the sample index where a phase starts (e.g. 'after_warmup:concurrency=4')."""
        self.marks[label] = len(self.samples)

    def sample(self) -> dict[str, Any]:
        s: dict[str, Any] = {"t_ns": time.perf_counter_ns(), "rss_bytes": self._tree.rss(),
                             "gpu_bytes": self._gpu.used()}
        if len(self.samples) % self.engine_every:
            return s
        try:
            fut = asyncio.run_coroutine_threadsafe(self.engine.snapshot(), self.loop)
            snap = fut.result(timeout=1.0)
            s.update(kv_used_tokens=snap.kv_used_tokens, kv_capacity_tokens=snap.kv_capacity_tokens,
                     kv_usage=snap.kv_usage, num_running=snap.num_running, num_waiting=snap.num_waiting)
            if snap.gpu_bytes is not None:
                s["gpu_bytes"] = snap.gpu_bytes
        except Exception:  # engine busy or gone: keep the process numbers
            pass
        return s

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.samples)

    def summary(self, since: int = 0, until: int | None = None) -> dict[str, Any]:
        """Peak over the samples in [since, until); after-warm-up = the first sample there."""
        df = pd.DataFrame(self.samples[since:until])
        out: dict[str, Any] = {"samples": len(df)}
        if df.empty:
            return out

        def col(name: str) -> pd.Series:
            return df[name].dropna() if name in df else pd.Series(dtype=float)

        for name in ("rss_bytes", "gpu_bytes", "kv_used_tokens", "kv_usage", "num_running"):
            c = col(name)
            out[f"peak_{name}"] = float(c.max()) if len(c) else None
        for name in ("rss_bytes", "gpu_bytes"):
            c = col(name)
            out[f"after_warmup_{name}"] = float(c.iloc[0]) if len(c) else None
        c = col("num_running")
        c = c[c > 0]  # while the engine was busy: the batch a decode step sees
        out["mean_num_running"] = float(c.mean()) if len(c) else None
        cap = col("kv_capacity_tokens")
        out["kv_capacity_tokens"] = int(cap.iloc[-1]) if len(cap) else None
        return out
