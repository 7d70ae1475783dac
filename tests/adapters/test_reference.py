"""The reference adapter, in-process and behind a real `inferlab serve` subprocess."""
from __future__ import annotations

import asyncio

import psutil
import pytest
from tests.adapters.adapter_util import random_prompts, reference_greedy, run_all, tokens

from adapters.base import GenerationRequest, SamplingConfig
from adapters.launcher import Launcher
from adapters.reference import ReferenceEngine, ReferenceInProcess
from adapters.reference_server import ReferenceServer

KV_TOKENS = 4096


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from reference_engine import LLM

    return LLM(str(tiny_llama), kv_cache_tokens=KV_TOKENS)


async def test_in_process_matches_offline_greedy(tiny_llama, llm):
    prompts = random_prompts(tiny_llama, 6, seed=1)
    lens = [3, 9, 1, 12, 7, 5]
    want = [o.token_ids for o in reference_greedy(llm, prompts, lens)]
    engine = ReferenceEngine(str(tiny_llama), "float32", {"kv_cache_tokens": KV_TOKENS, "max_num_seqs": 4})
    info = await engine.start()
    try:
        assert (info.engine, info.mode, info.kv_capacity_tokens, info.block_size) == \
            ("reference", "in_process", KV_TOKENS, 16)
        assert info.knobs["max_num_seqs"] == 4 and info.pid is None
        got = await run_all(engine, prompts, lens)
    finally:
        await engine.stop()
    assert [tokens(evs) for evs in got] == want
    for evs, p, n in zip(got, prompts, lens):
        last = evs[-1]
        assert (last.finish_reason, last.prompt_tokens, last.completion_tokens) == ("length", len(p), n)


async def test_in_process_abort_and_early_exit_free_the_cache(tiny_llama):
    engine = ReferenceEngine(str(tiny_llama), "float32", {"kv_cache_tokens": KV_TOKENS})
    await engine.start()
    try:
        prompt = random_prompts(tiny_llama, 1, seed=2)[0]
        events = []
        async for ev in engine.generate(GenerationRequest("a", prompt, SamplingConfig(max_tokens=500))):
            events.append(ev)
            if len(events) == 3:
                snap = await engine.snapshot()
                assert snap.num_running == 1 and snap.kv_used_tokens > 0 and snap.kv_capacity_tokens == KV_TOKENS
                await engine.abort("a")
        assert events[-1].finished and events[-1].finish_reason == "abort" and len(tokens(events)) < 500

        # a consumer that walks away mid-stream aborts its request too
        gen = engine.generate(GenerationRequest("b", prompt, SamplingConfig(max_tokens=500)))
        await gen.__anext__()
        await gen.aclose()
        for _ in range(200):
            snap = await engine.snapshot()
            if snap.num_running == 0 and snap.kv_used_tokens == 0:
                break
            await asyncio.sleep(0.02)
        assert (snap.num_running, snap.num_waiting, snap.kv_used_tokens) == (0, 0, 0)
    finally:
        await engine.stop()


async def test_bad_request_is_a_value_error(tiny_llama):
    engine = ReferenceEngine(str(tiny_llama))
    await engine.start()
    try:
        with pytest.raises(ValueError, match="temperature"):
            await anext(engine.generate(GenerationRequest("x", [5, 6], SamplingConfig(temperature=-1.0))))
        with pytest.raises(ValueError):
            await anext(engine.generate(GenerationRequest("y", [], SamplingConfig())))
    finally:
        await engine.stop()


def test_options_are_checked_at_construction(tiny_llama):
    with pytest.raises(ValueError, match=r"unknown option\(s\) max_batch.*known:.*block_size"):
        ReferenceEngine(str(tiny_llama), "float32", {"max_batch": 3})
    with pytest.raises(ValueError, match="mode must be one of"):
        ReferenceEngine(str(tiny_llama), "float32", {"mode": "cloud"})
    with pytest.raises(ValueError, match='need mode = "server"'):
        ReferenceEngine(str(tiny_llama), "float32", {"log_path": "/tmp/x.log"})
    with pytest.raises(ValueError, match="max_waiting"):  # a server-only knob
        ReferenceEngine(str(tiny_llama), "float32", {"max_waiting": 4})
    with pytest.raises(ValueError, match="kv_cache_bytes"):  # `inferlab serve` has no such flag
        ReferenceEngine(str(tiny_llama), "float32", {"mode": "server", "kv_cache_bytes": 1 << 20})
    assert isinstance(ReferenceEngine(str(tiny_llama))._impl, ReferenceInProcess)


def test_server_command_line(tiny_llama):
    engine = ReferenceEngine(str(tiny_llama), "bfloat16",
                             {"mode": "server", "max_num_seqs": 8, "kv_cache_tokens": 1024, "port": 5555})
    impl = engine._impl
    assert isinstance(impl, ReferenceServer)
    impl.server.launcher = Launcher.parse(None)  # what start() sets before building the argv
    argv = impl.server_argv()
    assert argv[1:5] == ["-m", "experiments.cli", "serve", str(tiny_llama)]
    flags = " ".join(argv[5:])
    assert "--host 127.0.0.1 --port 5555 --dtype bfloat16" in flags
    assert "--kv-cache-tokens 1024 --max-num-seqs 8" in flags


@pytest.mark.slow
async def test_server_mode_matches_offline_and_leaves_no_process(tiny_llama, llm, tmp_path):
    prompts = random_prompts(tiny_llama, 4, seed=3)
    want = [o.token_ids for o in reference_greedy(llm, prompts, 8)]
    engine = ReferenceEngine(str(tiny_llama), "float32",
                             {"mode": "server", "kv_cache_tokens": KV_TOKENS, "log_path": str(tmp_path / "s.log")})
    info = await engine.start()
    try:
        assert (info.mode, info.kv_capacity_tokens, info.block_size) == ("server", KV_TOKENS, 16)
        assert info.knobs["events_carry_token_ids"] is True and psutil.pid_exists(info.pid)
        assert info.unhonoured == {} and info.metrics_url.endswith("/metrics")  # the budget became the capacity
        got = await run_all(engine, prompts, 8)
        snap = await engine.snapshot()
        assert (snap.kv_capacity_tokens, snap.num_running, snap.kv_used_tokens) == (KV_TOKENS, 0, 0)
    finally:
        await engine.stop()
    assert [tokens(evs) for evs in got] == want
    assert all(evs[-1].completion_tokens == 8 for evs in got)
    assert (tmp_path / "s.log").exists()
    try:
        gone = psutil.Process(info.pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        gone = True
    assert gone, f"server pid {info.pid} still alive after stop()"
