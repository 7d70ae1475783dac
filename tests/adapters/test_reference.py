"""The reference adapter, in-process and behind a real `inferlab serve` subprocess."""
from __future__ import annotations

import asyncio

import psutil
import pytest

from adapters.base import GenerationRequest, SamplingConfig
from adapters.engines.reference.adapter import ReferenceInProcess
from adapters.engines.reference.server import ReferenceServer
from adapters.registry import create
from adapters.transport.launcher import Launcher
from tests.adapters.adapter_util import random_prompts, reference_greedy, run_all, tokens

KV_TOKENS = 4096


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from reference_engine import LLM

    return LLM(str(tiny_llama), kv_cache_tokens=KV_TOKENS)


async def test_in_process_matches_offline_greedy(tiny_llama, llm):
    prompts = random_prompts(tiny_llama, 6, seed=1)
    lens = [3, 9, 1, 12, 7, 5]
    want = [o.token_ids for o in reference_greedy(llm, prompts, lens)]
    engine = create("reference", str(tiny_llama), "float32", {"kv_cache_tokens": KV_TOKENS, "max_num_seqs": 4})
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
    engine = create("reference", str(tiny_llama), "float32", {"kv_cache_tokens": KV_TOKENS})
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
    engine = create("reference", str(tiny_llama))
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
        create("reference", str(tiny_llama), "float32", {"max_batch": 3})
    with pytest.raises(ValueError, match="mode must be one of"):
        create("reference", str(tiny_llama), "float32", {"mode": "cloud"})
    with pytest.raises(ValueError, match='need mode = "server"'):
        create("reference", str(tiny_llama), "float32", {"log_path": "/tmp/x.log"})
    with pytest.raises(ValueError, match="max_waiting"):  # a server-only knob
        create("reference", str(tiny_llama), "float32", {"max_waiting": 4})
    with pytest.raises(ValueError, match="kv_cache_bytes"):  # `inferlab serve` has no such flag
        create("reference", str(tiny_llama), "float32", {"mode": "server", "kv_cache_bytes": 1 << 20})
    assert isinstance(create("reference", str(tiny_llama)), ReferenceInProcess)


def test_server_command_line(tiny_llama):
    engine = create("reference", str(tiny_llama), "bfloat16",
                             {"mode": "server", "max_num_seqs": 8, "kv_cache_tokens": 1024, "port": 5555})
    impl = engine
    assert isinstance(impl, ReferenceServer)
    impl.server.launcher = Launcher.parse(None)  # what start() sets before building the argv
    argv = impl.server_argv()
    assert argv[1:4] == ["-m", "reference_engine.server", str(tiny_llama)]  # the engine's own program
    flags = " ".join(argv[4:])
    assert "--host 127.0.0.1 --port 5555 --dtype bfloat16" in flags
    assert "--kv-cache-tokens 1024 --max-num-seqs 8" in flags


@pytest.mark.slow
async def test_server_mode_matches_offline_and_leaves_no_process(tiny_llama, llm, tmp_path):
    prompts = random_prompts(tiny_llama, 4, seed=3)
    want = [o.token_ids for o in reference_greedy(llm, prompts, 8)]
    engine = create("reference", str(tiny_llama), "float32",
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


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def cycle_prompt(model_dir, llm=None) -> list[int]:
    from reference_engine import LLM

    out = reference_greedy(llm or LLM(str(model_dir)), [[5, 6, 7]], 37)[0]
    return [5, 6, 7] + list(out.token_ids)  # 40 tokens of the model's own cycle: n-gram drafts get accepted


async def test_in_process_features_effective_memory_and_counters(cyclic_llama):
    """The engine's own report (effective_config / memory_report) becomes EngineInfo; the prefix-cache
    and speculation counters of EngineStats reach snapshot().extra and move as requests run."""
    prompt = cycle_prompt(cyclic_llama)
    engine = create("reference", str(cyclic_llama), "float32", {"kv_cache_tokens": KV_TOKENS, "enable_prefix_caching": True,
                                                            "speculative_config": NGRAM})
    info = await engine.start()
    try:
        before = (await engine.snapshot()).extra
        runs = [await run_all(engine, [prompt], 16) for _ in range(2)]
        after = (await engine.snapshot()).extra
    finally:
        await engine.stop()
    eff = info.effective
    assert (eff["prefix_caching"], eff["speculative"]["method"], eff["speculative"]["num_speculative_tokens"]) == \
        (True, "ngram", 3)
    assert (eff["kv_capacity_tokens"], eff["block_size"], eff["dtype"], eff["cuda_graphs"]) == (KV_TOKENS, 16,
                                                                                                "float32", False)
    assert eff["sources"]["prefix_caching"].startswith("LLMEngine")
    assert info.memory["kv_allocated"] == KV_TOKENS * info.memory["kv_bytes_per_token"] and info.memory["weights"] > 0
    assert info.unhonoured == {}
    assert set(after) == {"num_preemptions_total", "prefix_cache_queries", "prefix_cache_hits",
                          "spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                          "tp_decode_steps", "tp_decode_seconds", "tp_decode_allreduce_seconds",
                          "tp_decode_allreduce_bytes", "request_queue_time_s", "request_queue_count"}
    assert after["tp_decode_steps"] == 0  # one rank: nothing all-reduced, nothing counted
    # arrival -> first scheduled, summed (the sweep's queue signal): both requests were scheduled once each
    assert after["request_queue_count"] - before["request_queue_count"] == 2 and after["request_queue_time_s"] >= 0
    assert all(before[k] == 0 for k in after if k.startswith(("prefix", "spec")))
    assert after["prefix_cache_hits"] >= 32 and after["prefix_cache_queries"] >= 2 * len(prompt) - 1
    assert 0 < after["spec_decode_num_accepted_tokens"] <= after["spec_decode_num_draft_tokens"]
    assert tokens(runs[0][0]) == tokens(runs[1][0])


def test_server_feature_flags_parse_with_inferlab_serve(tiny_llama):
    """--enable-prefix-caching / --no-enable-prefix-caching and --speculative-config '<json>' as
    `inferlab serve`'s own parser reads them (reference_engine/server/cli.py)."""
    from reference_engine.server.cli import parse

    for prefix in (True, False):
        impl = create("reference", str(tiny_llama), "float32", {"mode": "server", "port": 5555,
                                                            "enable_prefix_caching": prefix,
                                                            "speculative_config": NGRAM})
        impl.server.launcher = Launcher.parse(None)
        argv = impl.server_argv()
        assert ("--enable-prefix-caching" if prefix else "--no-enable-prefix-caching") in argv
        ns = parse(argv[argv.index("reference_engine.server") + 1:])
        assert ns.enable_prefix_caching is prefix and ns.speculative_config == NGRAM


@pytest.mark.slow
async def test_server_mode_features_reset_and_counters(cyclic_llama, tmp_path):
    """`inferlab serve` with prefix caching and n-gram speculation: reset_prefix_cache is False (409)
    while a request holds blocks and True after; the speculation counters at /metrics move."""
    import httpx

    from adapters.engines.reference.server import REFERENCE
    from adapters.transport import prom

    prompt = cycle_prompt(cyclic_llama)
    engine = create("reference", str(cyclic_llama), "float32", {
        "mode": "server", "kv_cache_tokens": KV_TOKENS, "enable_prefix_caching": True, "speculative_config": NGRAM,
        "log_path": str(tmp_path / "s.log")})
    info = await engine.start()
    try:
        assert "--speculative-config" in info.effective["launch_command"]
        assert (info.effective["kv_capacity_tokens"], info.effective["kv_blocks"]) == (KV_TOKENS, KV_TOKENS // 16)
        async with httpx.AsyncClient(base_url=engine.base_url) as c:
            has_route = (await c.get("/server_info")).status_code == 200
        if has_route:  # once the server reports its settings, they are the ones asked
            assert info.effective["prefix_caching"] is True and info.unhonoured == {}
        else:  # until then the adapter says it cannot confirm them, never assumes
            assert "does not report" in info.unhonoured["speculative_config"]
            assert "prefix_caching" not in info.effective and "speculative" not in info.effective
        long = engine.generate(GenerationRequest("long", prompt, SamplingConfig(max_tokens=300)))
        await long.__anext__()
        held = await engine.reset_prefix_cache()  # the long request holds blocks: 409
        await engine.abort("long")
        async for _ in long:
            pass
        await run_all(engine, [prompt], 16)
        freed = await engine.reset_prefix_cache()
        async with httpx.AsyncClient(base_url=engine.base_url) as c:
            m = prom.Metrics.parse((await c.get("/metrics")).text)
    finally:
        await engine.stop()
    assert held is False and freed is True
    counters = {k: m.value(*names) for k, names in REFERENCE.counters().items()}
    assert counters["spec_draft_tokens"] > 0 and counters["spec_accepted_tokens"] > 0


async def test_attached_server_reads_the_engines_own_report_from_server_info():
    """When `inferlab serve` answers GET /server_info with its engine's effective_config() and
    memory_report() (the route this adapter asks for), those become EngineInfo; the labels fill
    only what it leaves out. The answer here is built in that shape (values made up)."""
    import json

    from tests.adapters.replay import Replay, fixture

    report = {"effective": {"dtype": "float32", "kv_capacity_tokens": 4096, "prefix_caching": False,
                            "speculative": None, "max_num_seqs": 8},
              "memory": {"weights": 123456, "kv_allocated": 4096 * 2048, "kv_bytes_per_token": 2048}}
    routes = {("GET", "/v1/models"): (200, "application/json", fixture("vllm", "models.json")),
              ("GET", "/metrics"): (200, "text/plain", fixture("vllm", "metrics.txt")),
              ("GET", "/server_info"): (200, "application/json", json.dumps(report).encode()),
              ("POST", "/v1/completions"): (200, "text/event-stream", fixture("vllm", "completions_stream.sse"))}
    with Replay(routes) as srv:
        e = create("reference", "m", "float32", {"url": srv.url, "enable_prefix_caching": True})
        info = await e.start()
        await e.stop()
    assert (info.effective["prefix_caching"], info.effective["speculative"], info.effective["max_num_seqs"]) == \
        (False, False, 8)
    assert info.effective["sources"]["max_num_seqs"].startswith("/server_info effective")
    assert info.effective["block_size"] == 128 and info.effective["sources"]["block_size"].startswith("vllm:cache")
    assert info.memory == report["memory"]
    assert "reports false" in info.unhonoured["enable_prefix_caching"]
