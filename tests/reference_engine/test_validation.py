"""Bad input gets a clear error naming the problem, and the engine keeps serving the rest."""
from __future__ import annotations

import json
import shutil

import pytest

from reference_engine import LLM, AsyncEngine, EngineConfig, SamplingParams


@pytest.mark.parametrize("kwargs, match", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_k": -5}, "top_k"),
    ({"min_p": 2.0}, "min_p"),
    ({"logprobs": 99}, "logprobs"),
])
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_bad_prompts(tiny_llama):
    llm = LLM(str(tiny_llama), max_model_len=64)
    e = llm.engine
    ok = SamplingParams(max_tokens=4)
    with pytest.raises(ValueError, match="prompt is empty"):
        e.add_request([], ok)
    with pytest.raises(ValueError, match="context length"):
        e.add_request(list(range(10, 80)), ok)
    with pytest.raises(ValueError, match="vocabulary"):
        e.add_request([10, 10 ** 9], ok)
    with pytest.raises(ValueError, match="vocabulary"):
        e.add_request([-1], ok)
    assert not e.has_unfinished()  # nothing half-queued


def test_missing_and_malformed_model_dirs(tmp_path, tiny_llama):
    with pytest.raises(FileNotFoundError, match="model directory not found"):
        LLM(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LLM(str(tmp_path))
    bad = tmp_path / "bad"
    shutil.copytree(tiny_llama, bad)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="malformed config.json"):
        LLM(str(bad))
    cfg = json.loads((tiny_llama / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported architecture.*LlamaForCausalLM"):
        LLM(str(bad))
    (bad / "config.json").write_text((tiny_llama / "config.json").read_text())
    (bad / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(str(bad))


def test_bad_engine_config():
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig("m", block_size=0)
    with pytest.raises(ValueError, match="not both"):
        EngineConfig("m", kv_cache_tokens=10, kv_cache_bytes=10)
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig("m", dtype="int8")


async def test_async_engine_rejects_bad_request_and_keeps_serving(tiny_llama):
    engine = await AsyncEngine(EngineConfig(str(tiny_llama), max_model_len=128)).start()
    try:
        good = engine.add_request([10, 11, 12], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        with pytest.raises(ValueError, match="context length"):
            engine.add_request(list(range(10, 130)), SamplingParams(max_tokens=16))
        with pytest.raises(ValueError, match="prompt is empty"):
            engine.add_request([], SamplingParams(max_tokens=16))
        with pytest.raises(ValueError, match="already in use"):
            engine.add_request([5], SamplingParams(max_tokens=1), request_id=good.request_id)
        deltas = [d async for d in good]
        assert sum(len(d.new_token_ids) for d in deltas) == 8
        assert deltas[-1].finished and deltas[-1].finish_reason == "length"
        assert engine.stats().kv_used_blocks == 0
    finally:
        await engine.shutdown()
