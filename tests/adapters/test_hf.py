"""The HF transformers baseline: static batches through generate(), token-exact with the engine."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

from adapters.base import GenerationRequest, SamplingConfig
from adapters.engines.hf.adapter import HFEngine
from tests.adapters.adapter_util import collect, random_prompts, reference_greedy, run_all, tokens


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from reference_engine import LLM

    return LLM(str(tiny_llama))


async def started(model, **options) -> HFEngine:
    engine = HFEngine(str(model), "float32", options)
    await engine.start()
    return engine


async def test_batches_match_offline_greedy(tiny_llama, llm):
    # 6 requests, batches of 4: left padding (lengths differ) and one batch with mixed max_tokens
    prompts = random_prompts(tiny_llama, 6, seed=5)
    lens = [6, 2, 10, 4, 8, 3]
    want = [o.token_ids for o in reference_greedy(llm, prompts, lens)]
    engine = await started(tiny_llama, max_batch_size=4)
    try:
        assert engine.info.knobs["baseline"] == "naive static batching (HF generate)"
        assert engine.info.kv_capacity_tokens is None and engine.info.engine == "hf"
        got = await run_all(engine, prompts, lens)
    finally:
        await engine.stop()
    assert [tokens(evs) for evs in got] == want
    for evs, p, n in zip(got, prompts, lens):
        assert all(len(e.token_ids) == 1 for e in evs)  # one token per step
        assert (evs[-1].finish_reason, evs[-1].prompt_tokens, evs[-1].completion_tokens) == ("length", len(p), n)


async def test_static_batching_makes_late_requests_wait(tiny_llama):
    """With max_batch_size=2, the third request starts only after the first batch finished."""
    prompts = random_prompts(tiny_llama, 3, seed=6)
    engine = await started(tiny_llama, max_batch_size=2)
    try:
        got = await run_all(engine, prompts, 6)
    finally:
        await engine.stop()
    first_batch_done = max(evs[-1].recv_ns for evs in got[:2])
    assert got[2][0].recv_ns > first_batch_done


def _with_eos(model_dir, tmp_path, eos: int):
    """A copy of the model whose EOS id is `eos` (config, generation config), weights shared by link."""
    import shutil

    dest = tmp_path / "eos-model"
    shutil.copytree(model_dir, dest, copy_function=os.link)
    for name in ("config.json", "generation_config.json"):
        (dest / name).unlink()  # a hard link: rewrite a fresh file, never the shared one
        cfg = json.loads((model_dir / name).read_text())
        cfg["eos_token_id"] = eos
        (dest / name).write_text(json.dumps(cfg))
    return dest


async def test_eos_stops_unless_ignored(tiny_llama, llm, tmp_path):
    """ignore_eos=False stops at EOS like the engine; ignore_eos=True generates past it
    (EOS may appear in the output, exactly as in vLLM and the reference engine). EOS is made
    a token the model emits greedily, so the test does not depend on which weights it has."""
    prompts = random_prompts(tiny_llama, 3, seed=7, lo=3, hi=24)
    free = reference_greedy(llm, prompts, 16)
    eos = free[0].token_ids[5]
    model = _with_eos(tiny_llama, tmp_path, eos)
    from reference_engine import LLM

    eos_llm = LLM(str(model))
    want_stop = [o.token_ids for o in reference_greedy(eos_llm, prompts, 16, ignore_eos=False)]
    want_ignore = [o.token_ids for o in reference_greedy(eos_llm, prompts, 16, ignore_eos=True)]
    assert len(want_stop[0]) <= 6 and want_stop[0][-1] == eos
    engine = await started(model, max_batch_size=8)
    try:
        got_stop = await run_all(engine, prompts, 16, ignore_eos=False)
        got_ignore = await run_all(engine, prompts, 16, ignore_eos=True)
    finally:
        await engine.stop()
    assert [tokens(e) for e in got_stop] == want_stop
    assert got_stop[0][-1].finish_reason == "stop" and len(tokens(got_stop[0])) < 16
    assert [tokens(e) for e in got_ignore] == want_ignore
    assert len(tokens(got_ignore[0])) == 16 and eos in tokens(got_ignore[0])  # went past EOS


async def test_abort_drops_one_row_and_the_rest_finish(tiny_llama, llm):
    prompts = random_prompts(tiny_llama, 3, seed=8)
    want = [o.token_ids for o in reference_greedy(llm, prompts, 20)]
    engine = await started(tiny_llama, max_batch_size=4)
    try:
        async def aborted():
            events = []
            async for ev in engine.generate(GenerationRequest("x", prompts[1], SamplingConfig(max_tokens=20))):
                events.append(ev)
                if len(events) == 2:
                    await engine.abort("x")
            return events

        reqs = [GenerationRequest(f"r{i}", prompts[i], SamplingConfig(max_tokens=20)) for i in (0, 2)]
        a, r0, r2 = await asyncio.gather(aborted(), collect(engine, reqs[0]), collect(engine, reqs[1]))
        snap = await engine.snapshot()
    finally:
        await engine.stop()
    assert a[-1].finish_reason == "abort" and len(tokens(a)) == 2 and tokens(a) == want[1][:2]
    assert [tokens(r0), tokens(r2)] == [want[0], want[2]]
    assert snap.num_waiting == 0 and snap.kv_capacity_tokens is None


async def test_seeded_sampling_is_reproducible(tiny_llama):
    prompt = random_prompts(tiny_llama, 1, seed=9)[0]
    engine = await started(tiny_llama)
    try:
        runs = [tokens(await collect(engine, GenerationRequest(f"s{i}", prompt, SamplingConfig(
            max_tokens=12, temperature=1.0, top_k=50, seed=123)))) for i in range(2)]
    finally:
        await engine.stop()
    assert runs[0] == runs[1] and len(runs[0]) == 12


async def test_bad_requests_and_options(tiny_llama):
    with pytest.raises(ValueError, match="max_batch_size"):
        HFEngine(str(tiny_llama), "float32", {"max_batch_size": 0})
    with pytest.raises(ValueError, match="unknown option"):
        HFEngine(str(tiny_llama), "float32", {"batch": 2})
    engine = await started(tiny_llama, kv_cache_tokens=1024)
    try:
        assert "ignored" in engine.info.knobs["kv_cache_tokens"]
        cases = [([], SamplingConfig(), "empty prompt"),
                 ([10**6], SamplingConfig(), "out of range"),
                 ([5], SamplingConfig(max_tokens=10**6), "exceeds"),
                 ([5], SamplingConfig(stop=["."]), "stop strings")]
        for i, (ids, s, msg) in enumerate(cases):
            with pytest.raises(ValueError, match=msg):
                await anext(engine.generate(GenerationRequest(f"b{i}", ids, s)))
    finally:
        await engine.stop()


def test_missing_transformers_names_the_install(tiny_llama):
    code = textwrap.dedent(f"""
        import asyncio, sys
        sys.modules["transformers"] = None  # as if the package were not installed
        from adapters.base import EngineUnavailable
        from adapters.engines.hf.adapter import HFEngine
        try:
            asyncio.run(HFEngine({str(tiny_llama)!r}).start())
        except EngineUnavailable as e:
            print("UNAVAILABLE", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "UNAVAILABLE" in out.stdout and "pip install 'inferlab[hf]'" in out.stdout, out.stdout + out.stderr


async def test_effective_is_what_the_baseline_is_and_features_are_unhonoured(tiny_llama):
    engine = await started(tiny_llama, max_batch_size=3, enable_prefix_caching=True,
                           speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    try:
        info = engine.info
    finally:
        await engine.stop()
    eff = info.effective
    assert (eff["dtype"], eff["max_num_seqs"], eff["max_model_len"]) == ("float32", 3, 2048)
    assert (eff["prefix_caching"], eff["speculative"], eff["paged_kv"], eff["cuda_graphs"]) == (False,) * 4
    assert "kv_capacity_tokens" not in eff and set(eff["sources"]) >= set(eff) - {"sources"}
    from adapters.common.model_shape import param_count

    weights = param_count(tiny_llama) * 4  # fp32; the parameters as the safetensors headers count them
    assert weights <= info.memory["weights"] < weights * 1.01 and set(info.memory) == {"weights", "runtime_base"}
    from adapters.common.runtime_base import rss  # CPU: the process before from_pretrained, less than it holds now
    assert 50 << 20 < info.memory["runtime_base"] < rss() and "before from_pretrained" in eff["sources"]["memory.runtime_base"]
    assert "no KV cache across requests" in info.unhonoured["enable_prefix_caching"]
    assert "plain generate()" in info.unhonoured["speculative_config"]


async def test_cpu_activation_peak_is_the_rss_high_water_since_the_load(tiny_llama):
    """memory() after the levels: generate()'s per-batch KV cache and activations land in the process's RSS
    high-water; 128 MiB of fresh pages touched now must show in it."""
    import mmap

    from adapters.common.runtime_base import rss

    engine = await started(tiny_llama, max_batch_size=2)
    try:
        now = rss()
        buf = mmap.mmap(-1, 128 << 20)
        for i in range(0, len(buf), 4096):
            buf[i] = 1
        buf.close()
        assert (await engine.memory())["activation_peak"] >= now + (128 << 20) - engine._rss_loaded - (8 << 20)
    finally:
        await engine.stop()


async def test_the_runs_max_model_len_is_its_limit_and_read_back(tiny_llama):
    """The harness gives every engine one context length; the baseline refuses beyond it, as vLLM does."""
    engine = await started(tiny_llama, max_model_len=40)
    try:
        assert engine.info.effective["max_model_len"] == 40
        ok = [ev async for ev in engine.generate(GenerationRequest("fits", [5] * 30, SamplingConfig(max_tokens=10)))]
        assert ok[-1].finished and len([t for ev in ok for t in ev.token_ids]) == 10
        with pytest.raises(ValueError, match=r"prompt \(31\) \+ max_tokens \(10\) exceeds the max_model_len \(40\)"):
            await anext(engine.generate(GenerationRequest("long", [5] * 31, SamplingConfig(max_tokens=10))))
    finally:
        await engine.stop()
    engine = await started(tiny_llama, max_model_len=10**6)  # capped by the model's context
    try:
        assert engine.info.effective["max_model_len"] == 2048
    finally:
        await engine.stop()


async def test_prefix_caching_off_is_honoured_trivially(tiny_llama):
    engine = await started(tiny_llama, enable_prefix_caching=False)
    try:
        assert engine.info.unhonoured == {}
    finally:
        await engine.stop()
