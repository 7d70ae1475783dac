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


async def test_streamed_text_never_shows_a_stop_string(tiny_llama):
    llm = LLM(str(tiny_llama))
    prompt = random_prompts(llm.engine.model_config.vocab_size, 1, 20, 21, seed=3)[0]
    [free] = llm.generate([prompt], SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
    i = next(i for i in range(len(free.text) // 2, len(free.text) - 3) if free.text[i:i + 4].strip())
    stop = free.text[i:i + 4]
    engine = await AsyncEngine(EngineConfig(str(tiny_llama))).start()
    try:
        deltas = [d async for d in engine.generate(prompt, SamplingParams(max_tokens=32, temperature=0.0,
                                                                         ignore_eos=True, stop=[stop]))]
    finally:
        await engine.shutdown()
    text = "".join(d.text_delta for d in deltas)
    assert text == free.text[: free.text.index(stop)]
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason == stop


async def test_reset_prefix_cache_and_speculative_streams(tiny_llama):
    """reset_prefix_cache between steps (False while a stream holds blocks, True when preempting it
    first); with a draft model a delta carries several tokens and the stream equals offline."""
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompt = [10, 11, 12] * 12
    [offline] = LLM(str(tiny_llama), kv_cache_tokens=2048).generate([prompt], params)
    spec = {"method": "draft_model", "model": str(tiny_llama), "num_speculative_tokens": 3}
    engine = await AsyncEngine(EngineConfig(str(tiny_llama), kv_cache_tokens=2048, speculative_config=spec)).start()
    try:
        deltas = [d async for d in engine.generate(prompt, params)]
        assert [t for d in deltas for t in d.new_token_ids] == offline.token_ids
        assert max(len(d.new_token_ids) for d in deltas) == 4  # k accepted + 1 in one delta
        assert engine.stats().kv_cached_blocks > 0 and await engine.reset_prefix_cache() is True
        assert engine.stats().kv_cached_blocks == 0

        stream = engine.add_request(prompt, params)
        toks = list((await stream.__anext__()).new_token_ids)
        assert await engine.reset_prefix_cache() is False  # the stream holds blocks
        assert await engine.reset_prefix_cache(reset_running_requests=True) is True
        toks += [t async for d in stream for t in d.new_token_ids]
        assert toks == offline.token_ids and engine.stats().num_preemptions_total == 1
    finally:
        await engine.shutdown()


async def test_a_failed_step_fails_its_streams_and_the_engine_keeps_serving(tiny_llama, monkeypatch):
    """A step that raises ends every in-flight stream with the error; the engine thread lives on."""
    from reference_engine.engine.llm_engine import LLMEngine

    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    real_step, calls = LLMEngine.step, []

    def broken_step(core):  # fails once, on the first step that holds all three requests
        if not calls and len(core.requests) == 3:
            calls.append(1)
            raise RuntimeError("planted")
        return real_step(core)

    monkeypatch.setattr(LLMEngine, "step", broken_step)  # the core runs in this process's engine thread
    engine = await AsyncEngine(EngineConfig(str(tiny_llama))).start()
    try:
        streams = [engine.add_request([5, 6, 7, i], params) for i in range(3)]
        for s in streams:
            try:
                async for _ in s:
                    pass
                raise AssertionError("the stream ended without the step's error")
            except RuntimeError as e:
                assert "engine step failed" in str(e) and "planted" in str(e)
        assert calls and engine.is_alive and engine.stats().num_running == 0 and engine.stats().kv_used_blocks == 0
        deltas = [d async for d in engine.generate([5, 6, 7], params)]
        assert deltas[-1].finished and sum(len(d.new_token_ids) for d in deltas) == 8
    finally:
        await engine.shutdown()
    assert not engine.is_alive


async def test_a_request_the_core_drops_without_an_end_still_ends_its_stream(tiny_llama, monkeypatch):
    """The invariant that every stream ends holds even against a core bug: a request that leaves the engine
    with no finished delta and no error (planted: one step forgets it silently) ends its stream with an
    error naming it, and the engine keeps serving."""
    from reference_engine.engine.llm_engine import LLMEngine

    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    real_step, dropped = LLMEngine.step, []

    def forgetful_step(core):
        deltas = real_step(core)
        if not dropped and "lost" in core.requests:  # forget it as a buggy path would: blocks freed, no delta
            req = core.requests["lost"]
            core.scheduler.finish(req)
            del core.requests["lost"]
            dropped.append(req)
            deltas = [d for d in deltas if d.request_id != "lost"]
        return deltas

    monkeypatch.setattr(LLMEngine, "step", forgetful_step)
    engine = await AsyncEngine(EngineConfig(str(tiny_llama))).start()
    try:
        kept = engine.add_request([5, 6, 7], params, request_id="kept")
        lost = engine.add_request([8, 9], params, request_id="lost")
        try:
            async for _ in lost:
                pass
            raise AssertionError("the dropped request's stream ended without an error")
        except RuntimeError as e:
            assert "dropped request 'lost'" in str(e)
        assert dropped and sum([len(d.new_token_ids) async for d in kept]) == 8
        assert engine.is_alive and engine._streams == {}
    finally:
        await engine.shutdown()
