"""TGI adapter: command line, a real recorded stream and log, and our own server's TGI routes."""
from __future__ import annotations


import pytest

from adapters.base import GenerationRequest, SamplingConfig
from adapters.launcher import Launcher
from adapters.tgi import TGIEngine, max_batch_total_tokens
from tests.adapters.adapter_util import check_stream, random_prompts, tokens
from tests.adapters.own_server import inferlab_serve
from tests.adapters.replay import Replay, fixture

RECORDED_IDS = [13, 32072, 30499, 32611, 32246, 30329, 30449, 32126, 32001, 30412, 29973, 13, 33676, 32709,
                32119, 13, 35072, 30329, 32001, 30267]


def fake_venv(tmp_path, script: str):
    (tmp_path / "bin").mkdir()
    for name in ("python", script):
        (tmp_path / "bin" / name).write_text("")
    return Launcher.parse(str(tmp_path))


def test_server_argv(tmp_path):
    e = TGIEngine("/models/llama", "float32", {"launcher": str(tmp_path), "kv_cache_tokens": 8192,
                                                "max_concurrent_requests": 64})
    s = e._impl.server
    s.launcher, s.port = fake_venv(tmp_path, "text-generation-launcher"), 8080
    assert e._impl.server_argv() == [
        str(tmp_path / "bin" / "text-generation-launcher"), "--model-id", "/models/llama", "--hostname", "127.0.0.1",
        "--port", "8080", "--max-batch-total-tokens", "8192", "--max-concurrent-requests", "64"]
    e = TGIEngine("/models/llama", "bfloat16", {})
    e._impl.server.launcher, e._impl.server.port = s.launcher, 8080
    assert e._impl.server_argv()[7:9] == ["--dtype", "bfloat16"]  # float32 is not a TGI dtype: never passed


def test_no_in_process_mode():
    with pytest.raises(ValueError, match="mode must be one of server, attach"):
        TGIEngine("m", "float32", {"mode": "in_process"})


def test_kv_capacity_from_the_recorded_startup_log():
    assert max_batch_total_tokens(fixture("tgi", "launcher_2.0.3.log").decode()) == 15232
    assert max_batch_total_tokens("INFO text_generation_router: Connected") is None


async def test_recorded_stream():
    """TGI 2.0.3's real /generate_stream body (fixtures/tgi/SOURCE.md), through huggingface_hub."""
    stream = (200, "text/event-stream", fixture("tgi", "generate_stream_2.0.3.sse"))
    with Replay({("POST", "/"): stream, ("POST", "/generate_stream"): stream}) as srv:
        e = TGIEngine("tokyotech-llm/Swallow-7b-hf", "float16", {"url": srv.url})
        info = await e.start()
        req = GenerationRequest("r1", [1, 2], SamplingConfig(max_tokens=20), prompt_text="日本で一番高い山はなんですか？")
        events = [ev async for ev in e.generate(req)]
        await e.stop()
    check_stream(events, "r1")
    assert tokens(events) == RECORDED_IDS
    assert "".join(ev.text for ev in events) == "\n日本で一番高い山はなんですか?\nベストアンサー\n富士山です。"
    assert events[-1].finish_reason is None  # the recorded request did not ask for details
    assert info.knobs["ignore_eos"] == "unsupported" and info.kv_capacity_tokens is None  # no /info recorded
    body = srv.posted("/")[0] if srv.posted("/") else srv.posted("/generate_stream")[0]
    assert body["inputs"] == "日本で一番高い山はなんですか？" and body["parameters"]["max_new_tokens"] == 20
    assert body["parameters"]["details"] is True and body["stream"] is True


@pytest.mark.slow
async def test_against_our_own_tgi_routes(tiny_llama, tmp_path):
    prompts = random_prompts(tiny_llama, 3, seed=3)
    async with inferlab_serve(tiny_llama, tmp_path) as url:
        e = TGIEngine(str(tiny_llama), "float32", {"url": url})
        info = await e.start()
        runs = []
        for i, ids in enumerate(prompts):  # no prompt_text: the adapter decodes the ids itself
            req = GenerationRequest(f"r{i}", ids, SamplingConfig(max_tokens=8))
            runs.append([ev async for ev in e.generate(req)])
        snap = await e.snapshot()
        await e.stop()
    assert info.kv_capacity_tokens == 4096 and info.mode == "attach"
    for i, events in enumerate(runs):
        check_stream(events, f"r{i}")
        assert 1 <= len(tokens(events)) <= 8
        assert events[-1].finish_reason in ("length", "stop") and events[-1].completion_tokens == len(tokens(events))
        assert events[-1].prompt_tokens is not None  # the engine's own count of the re-tokenized text
    assert snap.kv_capacity_tokens == 4096
