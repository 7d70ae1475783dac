"""Memory sampling during a run, every ~100 ms, in a thread of its own.

Each sample: RSS of the engine's process tree (the engine's pid and all descendants; the
harness's own pid for an in-process engine) and GPU memory (NVML for the whole device when
pynvml is present, else torch.cuda for this process when torch is already imported and
sees a GPU). Neither touches the engine: RSS is read from the kernel, and the process tree
is rediscovered only between measured levels (`refresh()`), because scanning /proc holds
the interpreter lock for milliseconds.

The engine's own KV and queue gauges are not sampled here by default: asking a server
for them during a level perturbs it (see experiments/measuring/observer.py). The runner reads them
before and after each level; an opt-in timeline (`Timeline`) samples them during it.
Invariant: the sampler only reads; it never touches the engine's state.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import pandas as pd
import psutil


class ProcessTree:
    """RSS of a process and its descendants. Finding the descendants scans all of /proc in
    Python (milliseconds, holding the interpreter lock), so it happens only in `refresh()`
    (called between levels) or when no process is known yet; reading each known process's
    RSS is cheap."""

    def __init__(self, pid: int | None):
        self.pid = pid
        self.procs: list[psutil.Process] = []

    def refresh(self) -> None:
        if self.pid is None:
            return
        try:
            root = psutil.Process(self.pid)
            self.procs = [root] + root.children(recursive=True)
        except psutil.Error:
            self.procs = []

    def rss(self) -> int | None:
        if self.pid is None:  # an attached server: its process is not ours to see
            return None
        if not self.procs:
            self.refresh()
        total, alive = 0, False
        for p in self.procs:
            try:
                total += p.memory_info().rss
                alive = True
            except psutil.Error:  # a process that just exited
                pass
        return total if alive else None


    def cpu(self) -> dict[int, dict[str, Any]]:
        """CPU seconds (user + system) so far of each known process: pid -> {"name", "root", "cpu_s"}. Read
        at a level's two ends, the difference is each process's share of the level (the launched process is
        the server's front end; its descendants the engine cores, workers or replicas)."""
        out = {}
        for p in self.procs if self.pid is not None else []:
            try:
                t = p.cpu_times()
                out[p.pid] = {"name": p.name(), "root": p.pid == self.pid, "cpu_s": t.user + t.system,
                              "harness": p.pid == os.getpid()}  # an in-process engine: the harness's own time
            except psutil.Error:  # a process that just exited
                pass
        return out


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
    """Process and GPU memory every `interval_s`; with a `timeline` (see observer.Timeline)
    attached, also its engine gauges at the timeline's own rate."""

    def __init__(self, pid: int | None, interval_s: float = 0.1):
        self.pid, self.interval = pid, interval_s
        self.samples: list[dict[str, Any]] = []
        self.timeline = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inferlab-memory", daemon=True)
        self._gpu = _GPU()
        self._tree = ProcessTree(pid)
        self._lock = threading.Lock()

    def start(self) -> "MemorySampler":
        self._tree.refresh()
        self._thread.start()
        return self

    def refresh(self) -> None:
        """Rediscover the engine's process tree (between levels only: it holds the GIL)."""
        with self._lock:
            self._tree.refresh()

    def cpu(self) -> dict[int, dict[str, Any]]:
        """The engine's process tree's CPU seconds per process (ProcessTree.cpu)."""
        with self._lock:
            return self._tree.cpu()

    def sample(self) -> dict[str, Any]:
        with self._lock:
            s: dict[str, Any] = {"t_ns": time.perf_counter_ns(), "rss_bytes": self._tree.rss(),
                                 "gpu_bytes": self._gpu.used()}
        tl = self.timeline
        if tl is not None and tl.due():
            s.update(tl.sample())
        return s

    def now(self) -> int:
        """Take one sample at once (a level's first and last, however short it is); its index."""
        tl, self.timeline = self.timeline, None  # never an extra engine scrape
        try:
            self.samples.append(self.sample())
        finally:
            self.timeline = tl
        return len(self.samples) - 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(self.interval)

    def stop(self) -> None:
        """Ends the thread. From a coroutine call it through `asyncio.to_thread`: a timeline
        scrape in flight waits on the event loop, which a join on the loop's own thread blocks."""
        self.timeline = None
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
