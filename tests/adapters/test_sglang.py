"""SGLang adapter: command line, real /server_info and /generate responses replayed, diffing."""
from __future__ import annotations

import json
import sys

import pytest

from adapters.base import EngineUnavailable, GenerationRequest, RequestError, SamplingConfig
from adapters.launcher import Launcher
from adapters.sglang import SGLangEngine
from tests.adapters.replay import Replay, fixture
from tests.adapters.test_vllm import fake_package

RECORDED = json.loads(fixture("sglang", "generate_response.json"))


def built_stream(ids: list[int], meta: dict, cumulative: bool = True) -> bytes:
    """An SSE body framed as SGLang's http_server.py frames /generate (fixtures/sglang/SOURCE.md:
    built from the recorded final response, not itself recorded)."""
    events = []
    for i in range(1, len(ids) + 1):
        m = dict(meta) if i == len(ids) else {**meta, "finish_reason": None, "completion_tokens": i}
        out = ids[:i] if cumulative else ids[i - 1:i]
        events.append(b"data: " + json.dumps({"text": "", "output_ids": out, "meta_info": m}).encode() + b"\n\n")
    return b"".join(events) + b"data: [DONE]\n\n"


def routes(stream: bytes, server_info: bytes | None = None) -> dict:
    return {("GET", "/server_info"): (200, "application/json", server_info or fixture("sglang", "server_info.json")),
            ("POST", "/generate"): (200, "text/event-stream", stream),
            ("POST", "/flush_cache"): (200, "text/plain", b"Cache flushed.\n"),
            ("POST", "/abort_request"): (200, "application/json", b"{}")}


def test_server_argv(tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, "sglang")
    e = SGLangEngine("/m/qwen", "bfloat16", {"launcher": sys.executable, "kv_cache_tokens": 4096,
                                             "mem_fraction_static": 0.8, "disable_radix_cache": True})
    s = e._impl.server
    s.launcher, s.port = Launcher.parse(sys.executable), 30000
    assert e._impl.server_argv() == [
        sys.executable, "-m", "sglang.launch_server", "--model-path", "/m/qwen", "--host", "127.0.0.1", "--port",
        "30000", "--dtype", "bfloat16", "--enable-metrics", "--log-level", "warning", "--mem-fraction-static", "0.8",
        "--disable-radix-cache", "--max-total-tokens", "4096"]


async def test_recorded_server_info_and_stream():
    ids, meta = RECORDED["output_ids"], RECORDED["meta_info"]
    with Replay(routes(built_stream(ids, meta))) as srv:
        e = SGLangEngine("qwen/qwen2.5-0.5b-instruct", "float32", {"url": srv.url})
        info = await e.start()
        req = GenerationRequest("r1", [1, 2, 3, 4, 5, 6, 7], SamplingConfig(max_tokens=128, ignore_eos=True))
        events = [ev async for ev in e.generate(req)]
        assert await e.reset_prefix_cache() is True
        await e.stop()
    assert (info.kv_capacity_tokens, info.block_size, info.mode) == (20480, 1, "attach")
    assert info.version == "0.0.0.dev1+g54b06f199" and info.knobs["incremental_streaming_output"] is False
    assert [t for ev in events for t in ev.token_ids] == ids and all(len(ev.token_ids) == 1 for ev in events)
    assert [ev.finished for ev in events].count(True) == 1 and events[-1].finished
    assert (events[-1].finish_reason, events[-1].prompt_tokens, events[-1].completion_tokens) == ("length", 7, 128)
    body = srv.posted("/generate")[0]
    assert body["input_ids"] == [1, 2, 3, 4, 5, 6, 7] and body["stream"] is True and body["rid"] == "r1"
    assert body["sampling_params"] == {"max_new_tokens": 128, "temperature": 0.0, "top_p": 1.0, "ignore_eos": True}


async def test_incremental_server_is_not_diffed():
    ids, meta = RECORDED["output_ids"][:6], {**RECORDED["meta_info"], "completion_tokens": 6}
    info = json.loads(fixture("sglang", "server_info.json"))
    info["incremental_streaming_output"] = True  # as a server started with --incremental-streaming-output says
    with Replay(routes(built_stream(ids, meta, cumulative=False), json.dumps(info).encode())) as srv:
        e = SGLangEngine("m", "float32", {"url": srv.url})
        await e.start()
        events = [ev async for ev in e.generate(GenerationRequest("r", [1], SamplingConfig(max_tokens=6)))]
        await e.stop()
    assert [t for ev in events for t in ev.token_ids] == ids


async def test_incremental_stream_read_as_cumulative_is_a_request_error():
    ids, meta = RECORDED["output_ids"][:4], RECORDED["meta_info"]
    with Replay(routes(built_stream(ids, meta, cumulative=False))) as srv:
        e = SGLangEngine("m", "float32", {"url": srv.url})
        await e.start()
        with pytest.raises(RequestError, match="incrementally"):
            [ev async for ev in e.generate(GenerationRequest("r", [1], SamplingConfig(max_tokens=4)))]
        await e.stop()


async def test_missing_sglang_is_engine_unavailable(tmp_path):
    e = SGLangEngine("m", "float32", {"launcher": sys.executable, "work_dir": str(tmp_path)})
    with pytest.raises(EngineUnavailable, match="'sglang' is not installed.*sglang\\[all\\]"):
        await e.start()
    with pytest.raises(EngineUnavailable, match="sglang"):
        await SGLangEngine("m", "float32", {"mode": "in_process"}).start()


def test_bad_options():
    with pytest.raises(ValueError, match="unknown option"):
        SGLangEngine("m", "float32", {"mem_fraction": 0.5})
