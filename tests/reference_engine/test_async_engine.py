"""The asyncio API: concurrent streams equal the offline results; aborts free blocks."""
from __future__ import annotations

import asyncio

from reference_engine import LLM, AsyncEngine, EngineConfig, SamplingParams
from tests.reference_engine.helpers import random_prompts


async def test_concurrent_streams_match_offline_and_abort_frees_blocks(tiny_qwen2):
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    llm = LLM(str(tiny_qwen2))
    prompts = random_prompts(llm.engine.model_config.vocab_size, 8, 3, 50, seed=5)
    offline = llm.generate(prompts, params)

    engine = await AsyncEngine(EngineConfig(str(tiny_qwen2), block_size=8)).start()
    try:
        async def collect(p, rid):
            toks, text, last = [], "", None
            async for d in engine.generate(p, params, request_id=rid):
                toks += d.new_token_ids
                text += d.text_delta
                last = d
            return toks, text, last

        results = await asyncio.gather(*(collect(p, f"r{i}") for i, p in enumerate(prompts)))
        for (toks, text, last), off in zip(results, offline):
            assert toks == off.token_ids and text == off.text
            assert last.finished and last.num_output_tokens == 20 and last.num_prompt_tokens == len(off.prompt_token_ids)

        # abort mid-stream: the stream ends with finish_reason "abort" and all blocks come back
        long = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
        streams = [engine.add_request(p, long) for p in prompts]
        first = await streams[0].__anext__()
        assert first.new_token_ids
        for s in streams:
            engine.abort(s.request_id)
        for s in streams:
            ends = [d async for d in s]
            assert ends[-1].finished and ends[-1].finish_reason == "abort"
        await asyncio.sleep(0.05)
        assert engine.stats().kv_used_blocks == 0 and engine.stats().num_running == 0

        # a consumer that walks away (closes the generator) aborts its request
        gen = engine.generate(prompts[0], long)
        await gen.__anext__()
        await gen.aclose()
        for _ in range(50):
            if engine.stats().kv_used_blocks == 0:
                break
            await asyncio.sleep(0.02)
        assert engine.stats().kv_used_blocks == 0
    finally:
        await engine.shutdown()
