"""Memory sampling: the RSS of an engine's whole process tree, sampled in the background;
the engine's own KV numbers only with an opt-in timeline; nothing for a process we cannot see."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

from adapters.base import Engine, EngineInfo, MemorySnapshot
from experiments.measuring.memory import MemorySampler, ProcessTree
from experiments.measuring.observer import Timeline

# A parent that starts a child; the child holds ~200 MiB of touched memory until killed.
TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "b = bytearray(200 << 20); print('ready', flush=True); "
                          "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


class _KV(Engine):
    """Only `snapshot()` matters here: an engine reporting 30 of 100 KV tokens in use."""

    calls = 0

    async def start(self): ...
    def generate(self, request): ...
    async def abort(self, request_id): ...
    async def stop(self): ...

    async def snapshot(self) -> MemorySnapshot:
        self.calls += 1
        return MemorySnapshot(t_ns=time.perf_counter_ns(), kv_used_tokens=30, kv_capacity_tokens=100,
                              kv_usage=0.3, num_running=2, num_waiting=0)


async def _sample(pid: int, timeline_s: float | None) -> tuple[MemorySampler, _KV, Timeline | None]:
    engine = _KV("m")
    sampler = MemorySampler(pid, interval_s=0.02).start()
    tl = None
    if timeline_s:
        tl = Timeline(engine, EngineInfo("kv", "0", "m", "float32", kv_capacity_tokens=100),
                      asyncio.get_running_loop(), timeline_s)
        sampler.timeline = tl
    await asyncio.sleep(0.5)
    await asyncio.to_thread(sampler.stop)  # a scrape in flight needs this loop
    return sampler, engine, tl


async def test_sampler_sees_the_child_processes_and_never_asks_the_engine_by_default():
    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        sampler, engine, _ = await _sample(parent.pid, None)
    finally:
        parent.kill()
        parent.wait()
    s = sampler.summary()
    assert s["samples"] >= 5
    assert s["peak_rss_bytes"] > 200 * 2**20  # the child's 200 MiB counts toward the tree
    assert engine.calls == 0 and s["peak_kv_used_tokens"] is None  # nothing sent to the engine


async def test_opt_in_timeline_reads_the_engine_kv_and_times_each_read():
    sampler, engine, tl = await _sample(os.getpid(), 0.05)
    s = sampler.summary()
    assert engine.calls >= 3
    assert s["peak_kv_used_tokens"] == 30 and s["kv_capacity_tokens"] == 100 and s["mean_num_running"] == 2
    summ = tl.summary()
    assert summ["scrapes"] == engine.calls and summ["errors"] == 0 and summ["scrape_ms_max"] is not None


def test_no_process_no_rss():
    assert ProcessTree(None).rss() is None  # an attached server: never the harness's own RSS
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert ProcessTree(dead.pid).rss() is None
