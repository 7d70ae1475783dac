"""The engine core's heap stays bounded as prefills of ever new lengths pass (engine_core.bound_gemm_caches),
and an idle core hands its largest batch's memory back (cpu_heap.release_freed_cpu_memory, from the core's idle loop).

oneDNN's primitive cache and ideep's each keep up to 1,024 GEMMs by shape, each holding memory that grows
with its rows: a server meeting a new prefill length at almost every step grew its heap with every one
(the soak's RSS steps). Since the one-layout change (c4280b3) that is the oneDNN fallback's path
(`INFERLAB_LINEAR=onednn`, bf16 weights, no compiler), pinned here. The check runs the real engine in
a fresh process (the caches read their variables at their first GEMM) over prefills of distinct
lengths, twice: without the bound the heap's
bytes in use grow with each new length, with it they stop. Bytes in use (glibc's mallinfo2), not RSS:
freed activations that malloc keeps on purpose (`keep_freed_cpu_memory`) are not counted."""
from __future__ import annotations

import asyncio
import json
import platform
import subprocess
import sys

import pytest

from reference_engine import EngineConfig, SamplingParams
from reference_engine.engine.engine_process import ProcessAsyncEngine
from reference_engine.model import packed_linear

CHILD = r"""
import ctypes, json, sys
from reference_engine.engine import engine_core
if sys.argv[2] == "bound":
    engine_core.bound_gemm_caches()
from reference_engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.sampling_params import SamplingParams

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info

def in_use():
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd

core = LLMEngine(EngineConfig(model=sys.argv[1], max_model_len=2048, kv_cache_tokens=4096, num_threads=1,
                              enable_prefix_caching=False))

def prefill(n):
    core.add_request([(7 * i) % 8000 + 100 for i in range(n)], SamplingParams(max_tokens=1, temperature=0.0))
    while core.has_unfinished():
        core.step()

prefill(100)
used = [in_use()]
for lengths in (range(130, 700, 60), range(160, 700, 60)):  # 10 new lengths each
    for n in lengths:
        prefill(n)
    used.append(in_use())
print(json.dumps(used))
"""


def heap(model, mode: str) -> list[int]:
    p = subprocess.run([sys.executable, "-c", CHILD, str(model), mode], capture_output=True, text=True,
                       timeout=600, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                            "INFERLAB_LINEAR": "onednn"})  # timeout: a hang guard
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not packed_linear.onednn_available(),
                    reason="mallinfo2 is glibc's; the caches are oneDNN's")
def test_new_prefill_lengths_stop_growing_the_heap(tiny_llama):
    default = heap(tiny_llama, "default")
    bound = heap(tiny_llama, "bound")
    grew = [b - a for a, b in zip(default, default[1:])]
    assert min(grew) > 4 << 20, grew  # torch's defaults: each 10 new lengths add MiBs (the test can fail)
    assert bound[2] - bound[1] < 0.1 * grew[1], (bound, default)  # bounded: the second 10 add next to nothing


def _status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(key + ":"))


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim and /proc are glibc's and Linux's")
async def test_an_idle_core_hands_back_its_largest_batch(tiny_llama):
    # The runner keeps freed activations in the heap (no trim threshold), so without the idle trim the
    # core's RSS would stay at its busiest step's high-water mark (VmHWM, reset just before the batch).
    engine = await ProcessAsyncEngine(EngineConfig(str(tiny_llama), kv_cache_tokens=8192, num_threads=1)).start()
    try:
        pid = engine.core_pid
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        prompts = [[(13 * i + j) % 8000 + 100 for j in range(120)] for i in range(32)]  # 3,840 prefill tokens

        async def drain(p):
            return [d async for d in engine.generate(p, params)]

        await asyncio.gather(*(drain(p) for p in prompts))
        peak = _status(pid, "VmHWM")
        for _ in range(300):  # a hang guard, not a bound: the trim comes IDLE_TRIM_S after the last step
            if _status(pid, "VmRSS") < peak - (8 << 20):
                break
            await asyncio.sleep(0.1)
        assert _status(pid, "VmRSS") < peak - (8 << 20), (peak, _status(pid, "VmRSS"))
    finally:
        await engine.shutdown()
