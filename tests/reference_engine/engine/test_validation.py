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
    with pytest.raises(ValueError, match="stop_token_ids contains ids outside"):  # once failed the step
        e.add_request([10, 11], SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=[10 ** 6]))
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


def test_params_are_validated_once_when_made_and_not_again_downstream(tiny_llama, monkeypatch):
    """The boundary is construction: generating (LLM.generate -> validate -> enqueue -> steps) calls
    SamplingParams.validate no more; the engine checks only the request against the model."""
    params = SamplingParams(max_tokens=4, temperature=0)
    llm = LLM(str(tiny_llama), kv_cache_tokens=256)
    calls = []
    monkeypatch.setattr(SamplingParams, "validate", lambda self: calls.append(self))
    out = llm.generate([[1, 2, 3], [4, 5]], params)
    assert [len(o.token_ids) for o in out] == [4, 4] and calls == []


def test_greedy_is_one_definition_shared_by_runner_and_sampler():
    """`SamplingParams.argmax` (greedy, unpenalised) plus no banned ids is what both the runner's
    fast path and `SamplingBatch.all_greedy` use."""
    import torch

    from reference_engine.worker.sampler import all_argmax, banned_ids, make_batch

    cases = [SamplingParams(temperature=0), SamplingParams(temperature=0, repetition_penalty=1.2),
             SamplingParams(temperature=0.7), SamplingParams(temperature=0, min_tokens=2, max_tokens=4)]
    for p in cases:
        b = make_batch([p], [[1]], [[]], [None], "cpu", [[9]])
        assert b.all_greedy == all_argmax([p], banned_ids([p], [[]], [[9]]))
    assert [p.argmax for p in cases] == [True, False, False, True]
    assert banned_ids(cases[3:], [[]], [[9]]) == [[9]] and not all_argmax(cases[3:], [[9]])
    assert torch.equal(make_batch(cases[:1], [[1]], [[]], [None], "cpu").temperature, torch.tensor([0.0]))
