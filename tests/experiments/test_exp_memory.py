"""Memory sampling: the RSS of an engine's whole process tree, sampled in the background,
with the engine's own KV numbers; nothing for a process we cannot see."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from adapters.base import Engine, MemorySnapshot
from experiments.memory import MemorySampler, ProcessTree

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

    async def start(self): ...
    def generate(self, request): ...
    async def abort(self, request_id): ...
    async def stop(self): ...

    async def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(t_ns=time.perf_counter_ns(), kv_used_tokens=30, kv_capacity_tokens=100,
                              kv_usage=0.3, num_running=2, num_waiting=0)


async def test_sampler_sees_the_child_processes_and_the_engine_kv():
    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        sampler = MemorySampler(_KV("m"), parent.pid, asyncio.get_running_loop(), interval_s=0.02,
                                engine_every=2).start()
        await asyncio.sleep(0.5)
        sampler.stop()
    finally:
        parent.kill()
        parent.wait()
    s = sampler.summary()
    assert s["samples"] >= 5
    assert s["peak_rss_bytes"] > 200 * 2**20  # the child's 200 MiB counts toward the tree
    assert s["peak_kv_used_tokens"] == 30 and s["kv_capacity_tokens"] == 100 and s["mean_num_running"] == 2


def test_no_process_no_rss():
    assert ProcessTree(None).rss() is None  # an attached server: never the harness's own RSS
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert ProcessTree(dead.pid).rss() is None
