"""The TensorRT-LLM options file (`--extra_llm_api_options`) against TensorRT-LLM's own
argument models, rebuilt as pydantic models with `extra="forbid"` from the field lists recorded
in fixtures/trtllm/llm_args_fields.json (SOURCE.md): BaseLlmArgs + TorchLlmArgs for the PyTorch
backend, BaseLlmArgs + TrtLlmArgs for the TensorRT backend. A key the model does not define is
what makes trtllm-serve exit with a validation error at start."""
from __future__ import annotations

import json
from typing import Any, Optional

import pydantic
import pytest

from adapters.trtllm import BACKEND_KEYS, STOP_MATCH, TRTLLMEngine, llm_api_options
from tests.adapters.replay import Replay, facts, fixture
from tests.adapters.test_trtllm import gauges, trtllm_routes

FIELDS = json.loads(fixture("trtllm", "llm_args_fields.json"))
SPEC = facts("trtllm")["speculative"]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
DRAFT = {"method": "draft_model", "num_speculative_tokens": 4, "model": "/models/draft"}


def forbidding(name: str, fields: list[str], **typed: Any) -> type[pydantic.BaseModel]:
    loose = {f: (Optional[Any], None) for f in fields if f not in typed}
    return pydantic.create_model(name, __config__=pydantic.ConfigDict(extra="forbid"), **loose,
                                 **{f: (Optional[t], None) for f, t in typed.items()})


def args_model(backend: str) -> type[pydantic.BaseModel]:
    rec = FIELDS[backend]
    own = rec["TorchLlmArgs"] if backend == "pytorch" else rec["TrtLlmArgs"]
    kv = forbidding("KvCacheConfig", rec["KvCacheConfig"])
    ngram = forbidding("NGramDecodingConfig", ["decoding_type", *SPEC["base_fields"], *SPEC["ngram_fields"]])
    draft = forbidding("DraftTargetDecodingConfig", ["decoding_type", *SPEC["base_fields"]])
    return forbidding(f"{backend}LlmArgs", [*rec["BaseLlmArgs"], *own], kv_cache_config=kv,
                      speculative_config=ngram | draft)


OPTION_SETS = [
    {},
    {"kv_cache_tokens": 8192, "kv_cache_free_gpu_memory_fraction": 0.85},
    {"enable_prefix_caching": False, "enable_chunked_prefill": False},
    {"enable_block_reuse": True, "kv_cache_tokens": 1024},
]


@pytest.mark.parametrize("backend", ["pytorch", "tensorrt"])
@pytest.mark.parametrize("i", range(len(OPTION_SETS)))
def test_options_file_validates_against_the_backends_recorded_model(backend, i):
    opts = llm_api_options({**OPTION_SETS[i], "backend": backend}, "bfloat16")
    args_model(backend).model_validate({"model": "/models/llama", **opts})
    assert set(opts) <= set(BACKEND_KEYS[backend]) and opts["return_perf_metrics"] is True


@pytest.mark.parametrize("spec", [NGRAM, DRAFT], ids=["ngram", "draft"])
def test_speculative_options_validate_on_pytorch(spec):
    opts = llm_api_options({"speculative_config": spec}, "float16")
    args_model("pytorch").model_validate({"model": "/m", **opts})
    with pytest.raises(ValueError, match="needs backend pytorch"):
        llm_api_options({"speculative_config": spec, "backend": "tensorrt"}, "float16")


def test_iteration_stats_key_is_the_pytorch_backends_only():
    """Issue 25, defect 1: enable_iter_perf_stats is a TorchLlmArgs field; TrtLlmArgs (via
    BaseLlmArgs, extra="forbid") rejects it, so the TensorRT backend's file must leave it out."""
    assert "enable_iter_perf_stats" in FIELDS["pytorch"]["TorchLlmArgs"]
    assert "enable_iter_perf_stats" not in FIELDS["tensorrt"]["BaseLlmArgs"] + FIELDS["tensorrt"]["TrtLlmArgs"]
    with pytest.raises(pydantic.ValidationError, match="enable_iter_perf_stats"):
        args_model("tensorrt").model_validate({"model": "/m", "enable_iter_perf_stats": True})
    assert llm_api_options({}, "bfloat16")["enable_iter_perf_stats"] is True
    assert "enable_iter_perf_stats" not in llm_api_options({"backend": "tensorrt"}, "bfloat16")


def test_chunked_prefill_is_on_by_default_like_the_other_engines():
    """trtllm-serve's BaseLlmArgs.enable_chunked_prefill defaults to false; vLLM and SGLang chunk."""
    assert llm_api_options({}, "bfloat16")["enable_chunked_prefill"] is True
    assert llm_api_options({"enable_chunked_prefill": False}, "bfloat16")["enable_chunked_prefill"] is False


async def test_dtype_and_chunked_prefill_rows_are_labelled_as_requested():
    """trtllm_model_config_info's dtype label is str(args.dtype) (openai_server.py
    _log_config_info_metrics): the argument, not what was loaded; no gauge carries chunked prefill."""
    with Replay(trtllm_routes([[5]], gauges(100, 32, dtype="bfloat16"))) as srv:
        e = TRTLLMEngine("/m/tiny", "bfloat16", {"url": srv.url})
        info = await e.start()
        await e.stop()
    assert info.effective["dtype"] == "bfloat16"
    assert info.effective["sources"]["dtype"].startswith("as requested — the engine does not report it")
    assert "chunked_prefill" not in info.effective  # attached: the options file is not ours
    assert info.knobs["stop_strings"] == STOP_MATCH


async def test_stop_strings_are_sent_with_detokenize_false():
    """sampling_params.py @ 000a01de (_setup, _get_stop_words): stop strings become token-id
    sequences matched by the runtime, whatever `detokenize` says; so they are sent, and the
    knob says how they match."""
    from adapters.base import GenerationRequest, SamplingConfig

    with Replay(trtllm_routes([[11], [12]])) as srv:
        e = TRTLLMEngine("/m/tiny", "bfloat16", {"url": srv.url})
        await e.start()
        [ev async for ev in e.generate(GenerationRequest("r", [1, 2], SamplingConfig(max_tokens=2, stop=["\n\n"])))]
        await e.stop()
    body = srv.posted("/v1/completions")[-1]
    assert body["detokenize"] is False and body["stop"] == ["\n\n"]


async def test_a_version_outside_the_table_is_refused():
    routes = trtllm_routes([[5]])
    routes[("GET", "/version")] = (200, "application/json", b'{"version":"1.2.1"}')
    with Replay(routes) as srv:
        e = TRTLLMEngine("/m/tiny", "bfloat16", {"url": srv.url})
        with pytest.raises(Exception) as err:
            await e.start()
    assert str(err.value) == ("trtllm 1.2.1 is not in the adapter's version table (known: 1.3.0rc24; "
                              "adapters/versions.py)")
