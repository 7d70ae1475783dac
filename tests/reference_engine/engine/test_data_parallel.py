"""Data parallelism (data_parallel.py): two engine cores behind one front end, each pinned to its own CPU,
each request on the replica the router picked; streams equal the offline engine's, aborts reach the owner,
counters add up."""
from __future__ import annotations

import asyncio
import os

import pytest

from reference_engine import LLM, EngineConfig, SamplingParams
from reference_engine.engine.data_parallel import DataParallelEngine, split_cpus
from tests.reference_engine.helpers import random_prompts


def test_cpus_split_into_contiguous_even_groups():
    assert split_cpus(2, [0, 1]) == [(0,), (1,)]
    assert split_cpus(2, [0, 1, 2, 3, 4]) == [(0, 1, 2), (3, 4)]
    with pytest.raises(ValueError, match="needs at least 3 CPUs"):
        split_cpus(3, [0, 1])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two replicas need two CPUs")
async def test_two_replicas_serve_round_robin_pinned_apart(tiny_llama):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm = LLM(str(tiny_llama), kv_cache_tokens=1024)
    prompts = random_prompts(llm.engine.model_config.vocab_size, 4, 3, 30, seed=9)
    offline = llm.generate(prompts, params)
    engine = await DataParallelEngine(EngineConfig(str(tiny_llama), kv_cache_tokens=1024), 2, "round_robin").start()
    try:
        pids = engine.core_pids
        assert len(set(pids)) == 2 and [os.sched_getaffinity(p) for p in pids] == [set(g) for g in split_cpus(2)]
        eff = engine.effective_config()
        assert eff["data_parallel_size"] == 2 and eff["router"] == "round_robin"
        assert eff["kv_capacity_tokens"] == 2 * engine.replicas[0].effective_config()["kv_capacity_tokens"]

        async def run(p, rid):
            return [t async for d in engine.generate(p, params, request_id=rid) for t in d.new_token_ids]

        got = await asyncio.gather(*(run(p, f"r{i}") for i, p in enumerate(prompts)))
        assert got == [o.token_ids for o in offline]
        per = [r.stats().generation_tokens_total for r in engine.replicas]
        assert per == [24, 24]  # round robin: two requests of 12 tokens on each
        assert engine.stats().generation_tokens_total == 48 and engine.stats().num_requests_finished == 4

        # an abort reaches the replica that holds the request; the other ignores it
        long = SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True)
        stream = engine.add_request(prompts[0], long, request_id="long")
        await stream.__anext__()
        with pytest.raises(ValueError, match="already in use"):
            engine.add_request(prompts[1], long, request_id="long")
        engine.abort("long")
        assert [d async for d in stream][-1].finish_reason == "abort"
        mem = await engine.memory_report()
        assert mem["weights"] == sum([(await r.memory_report())["weights"] for r in engine.replicas])
    finally:
        await engine.shutdown()
    assert not engine.is_alive
