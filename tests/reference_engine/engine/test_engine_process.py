"""The engine core in a process of its own (`ProcessAsyncEngine`): the same streams as offline, aborts
free blocks, calls between steps, and a core that dies ends the open streams and `is_alive`."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from reference_engine import LLM, EngineConfig, SamplingParams
from reference_engine.engine.engine_process import ProcessAsyncEngine
from tests.reference_engine.helpers import random_prompts


async def test_streams_match_offline_aborts_free_blocks_and_calls_run_between_steps(tiny_llama):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm = LLM(str(tiny_llama), kv_cache_tokens=2048)
    prompts = random_prompts(llm.engine.model_config.vocab_size, 4, 3, 30, seed=7)
    offline = llm.generate(prompts, params)
    engine = await ProcessAsyncEngine(EngineConfig(str(tiny_llama), kv_cache_tokens=2048)).start()
    try:
        assert engine.is_alive and engine.core_pid != os.getpid()
        assert engine.effective_config()["engine_process"] is True and engine.max_model_len == llm.engine.max_model_len
        assert engine.effective_config()["wave_wait_max_ms"] == 30.0  # the batching wait is read back, not hidden
        assert engine.effective_config()["gc_frozen_objects"] > 1000  # the core's start-up heap, out of the GC's way
        with pytest.raises(ValueError, match="outside the vocabulary"):  # validated in the front end, at once
            engine.add_request([10 ** 9], params)

        async def collect(p):
            deltas = [d async for d in engine.generate(p, params)]
            return [t for d in deltas for t in d.new_token_ids], "".join(d.text_delta for d in deltas), deltas[-1]

        for (toks, text, last), off in zip(await asyncio.gather(*(collect(p) for p in prompts)), offline):
            assert toks == off.token_ids and text == off.text and last.finished and last.finish_reason == "length"
        assert engine.stats().generation_tokens_total == 4 * 12 and engine.stats().num_running == 0
        assert (await engine.memory_report())["kv_allocated"] > 0

        long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
        streams = [engine.add_request(p, long) for p in prompts]
        assert (await streams[0].__anext__()).new_token_ids
        assert await engine.reset_prefix_cache() is False  # the streams hold blocks
        for s in streams:
            engine.abort(s.request_id)
        for s in streams:
            assert [d async for d in s][-1].finish_reason == "abort"
        assert engine.stats().kv_used_blocks == 0 and await engine.reset_prefix_cache() is True
    finally:
        await engine.shutdown()
    assert not engine.is_alive


async def test_a_core_that_dies_ends_the_streams_and_is_alive(tiny_llama):
    engine = await ProcessAsyncEngine(EngineConfig(str(tiny_llama), kv_cache_tokens=2048)).start()
    try:
        stream = engine.add_request([5, 6, 7], SamplingParams(max_tokens=100000 // 100, temperature=0.0,
                                                              ignore_eos=True))
        await stream.__anext__()
        os.kill(engine.core_pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="engine process died"):
            async for _ in stream:
                pass
        assert not engine.is_alive
        with pytest.raises(RuntimeError):
            engine.add_request([5, 6, 7], SamplingParams(max_tokens=4))
    finally:
        await engine.shutdown()


async def test_a_core_that_cannot_start_raises_in_start(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')  # fields missing
    with pytest.raises(ValueError, match="lacks required field"):
        await ProcessAsyncEngine(EngineConfig(str(tmp_path))).start()


def test_an_idle_core_takes_a_burst_in_one_turn():
    """Requests that arrive together reach an idle core as one turn's batch (`_burst`), not the first
    alone: here all three are in the pipe before the core looks."""
    import multiprocessing

    from reference_engine.engine.engine_core import _burst
    r, w = multiprocessing.Pipe(duplex=False)
    for i in range(3):
        w.send([f"op{i}"])
    assert _burst(r) == [["op0"], ["op1"], ["op2"]]
    w.send(["later"])
    assert _burst(r) == [["later"]]


def test_an_idle_core_waits_for_as_many_requests_as_just_finished(monkeypatch):
    """A closed loop's wave: `expect` requests finished, so the core waits for that many new ones
    even when they come further apart than `BURST_GAP_S`; without a wave it steps after the gap.
    Only lower bounds on time matter here (sleeps), never how fast this machine is."""
    import multiprocessing
    import threading
    import time

    from reference_engine.engine import engine_core
    from reference_engine.engine.messages import AddRequest
    monkeypatch.setattr(engine_core, "WAVE_MAX_S", 600.0)
    adds = [AddRequest([1, 2], SamplingParams(max_tokens=1), f"r{i}") for i in range(3)]
    r, w = multiprocessing.Pipe(duplex=False)

    def send_later(ops, pause):
        for op in ops:
            time.sleep(pause)  # far longer than BURST_GAP_S
            w.send([op])

    def burst(expect, later, pause):
        w.send([adds[0]])
        sender = threading.Thread(target=send_later, args=(later, pause))
        sender.start()
        got = engine_core._burst(r, expect=expect)
        sender.join()
        return [m.request_id for b in got for m in b]

    assert burst(3, adds[1:], 0.05) == ["r0", "r1", "r2"]
    assert burst(1, adds[1:2], 0.5) == ["r0"]  # one finished: no wave to wait for
    assert [m.request_id for m in r.recv()] == ["r1"]


# A child script's last part: start a ProcessAsyncEngine on argv[1] and count 4 greedy tokens (main()).
GENERATE = """
from reference_engine import EngineConfig, SamplingParams
from reference_engine.engine.engine_process import ProcessAsyncEngine, start_method
async def main():
    engine = await ProcessAsyncEngine(EngineConfig(sys.argv[1], kv_cache_tokens=256, num_threads=2)).start()
    try:
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        return sum([len(d.new_token_ids) async for d in engine.generate([5, 6, 7], params)])
    finally:
        await engine.shutdown()
"""
CHILD = """
import asyncio, os, sys
import reference_engine, torch  # torch through the package: its threads after the import are counted
""" + GENERATE + """
before = start_method()
torch.ones(512, 512) @ torch.ones(512, 512)  # two threads: OpenMP's pool now exists in this process
after = start_method()
print(before, after, asyncio.run(main()))
"""


def test_a_process_that_ran_threaded_torch_ops_spawns_its_core(tiny_llama):
    """Forking after a multi-threaded torch op hung the child in OpenMP; such a process now spawns
    the core (`start_method`), and the core generates. A fresh interpreter with two OpenMP threads."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "INFERLAB_ENGINE_START"}
    env["OMP_NUM_THREADS"] = "2"
    p = subprocess.run([sys.executable, "-c", CHILD, str(tiny_llama)], env=env, capture_output=True, text=True,
                       timeout=900)  # a hang detector only (a hung fork never returns), not a time bound
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[-3:] == ["fork", "spawn", "4"]
