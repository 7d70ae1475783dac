"""The TensorRT-LLM options file (`--extra_llm_api_options`) against TensorRT-LLM's own
argument models at the pinned tag, rebuilt as pydantic models with `extra="forbid"` from the field
lists recorded at v1.3.0rc24 (adapters/engines/trtllm/upstream.json `llm_args`: TorchLlmArgs, its
BaseLlmArgs fields included, and KvCacheConfig). A key the model does not define is what makes
trtllm-serve exit with a validation error at start. The TensorRT backend (TrtLlmArgs) is gone at
that tag (`--backend` takes pytorch or _autodeploy), so the adapter refuses it."""
from __future__ import annotations

import json
from typing import Any, Optional

import pydantic
import pytest

from adapters.checks.dryrun import facts as upstream
from adapters.engines.trtllm.adapter import BACKEND_KEYS, STOP_MATCH, llm_api_options
from adapters.registry import create
from tests.adapters.replay import Replay, facts
from tests.adapters.test_trtllm import gauges, trtllm_routes

ARGS = upstream("trtllm")["llm_args"]
SPEC = facts("trtllm")["speculative"]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
DRAFT = {"method": "draft_model", "num_speculative_tokens": 4, "model": "/models/draft"}


def forbidding(name: str, fields: list[str], **typed: Any) -> type[pydantic.BaseModel]:
    loose = {f: (Optional[Any], None) for f in fields if f not in typed}
    return pydantic.create_model(name, __config__=pydantic.ConfigDict(extra="forbid"), **loose,
                                 **{f: (Optional[t], None) for f, t in typed.items()})


def args_model() -> type[pydantic.BaseModel]:
    kv = forbidding("KvCacheConfig", ARGS["kv_cache_config"])
    ngram = forbidding("NGramDecodingConfig", ["decoding_type", *SPEC["base_fields"], *SPEC["ngram_fields"]])
    draft = forbidding("DraftTargetDecodingConfig", ["decoding_type", *SPEC["base_fields"]])
    return forbidding("TorchLlmArgs", ARGS["pytorch"], kv_cache_config=kv, speculative_config=ngram | draft)


OPTION_SETS = [
    {},
    {"kv_cache_tokens": 8192, "kv_cache_free_gpu_memory_fraction": 0.85},
    {"enable_prefix_caching": False, "enable_chunked_prefill": False},
    {"enable_block_reuse": True, "kv_cache_tokens": 1024},
]


@pytest.mark.parametrize("i", range(len(OPTION_SETS)))
def test_options_file_validates_against_the_tags_argument_model(i):
    opts = llm_api_options(OPTION_SETS[i], "bfloat16")
    args_model().model_validate({"model": "/models/llama", **opts})
    assert set(opts) <= set(BACKEND_KEYS["pytorch"]) and opts["return_perf_metrics"] is True


@pytest.mark.parametrize("spec", [NGRAM, DRAFT], ids=["ngram", "draft"])
def test_speculative_options_validate_on_pytorch(spec):
    opts = llm_api_options({"speculative_config": spec}, "float16")
    args_model().model_validate({"model": "/m", **opts})


def test_the_backends_the_tag_accepts():
    """`--backend` at v1.3.0rc24: pytorch | _autodeploy (serve_flags); TrtLlmArgs no longer exists."""
    assert upstream("trtllm")["serve_flags"]["options"]["--backend"]["choices"] == ["pytorch", "_autodeploy"]
    assert set(BACKEND_KEYS) == {"pytorch"} and "enable_iter_perf_stats" in ARGS["pytorch"]
    with pytest.raises(ValueError, match=r"backend 'tensorrt' is not one of \['pytorch'\]"):
        llm_api_options({"backend": "tensorrt"}, "bfloat16")


def test_chunked_prefill_is_on_by_default_like_the_other_engines():
    """trtllm-serve's BaseLlmArgs.enable_chunked_prefill defaults to false; vLLM and SGLang chunk."""
    assert llm_api_options({}, "bfloat16")["enable_chunked_prefill"] is True
    assert llm_api_options({"enable_chunked_prefill": False}, "bfloat16")["enable_chunked_prefill"] is False


async def test_dtype_and_chunked_prefill_rows_are_labelled_as_requested():
    """trtllm_model_config_info's dtype label is str(args.dtype) (openai_server.py
    _log_config_info_metrics): the argument, not what was loaded; no gauge carries chunked prefill."""
    with Replay(trtllm_routes([[5]], gauges(100, 32, dtype="bfloat16"))) as srv:
        e = create("trtllm", "/m/tiny", "bfloat16", {"url": srv.url})
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
        e = create("trtllm", "/m/tiny", "bfloat16", {"url": srv.url})
        await e.start()
        [ev async for ev in e.generate(GenerationRequest("r", [1, 2], SamplingConfig(max_tokens=2, stop=["\n\n"])))]
        await e.stop()
    body = srv.posted("/v1/completions")[-1]
    assert body["detokenize"] is False and body["stop"] == ["\n\n"]


async def test_a_version_outside_the_table_is_refused():
    routes = trtllm_routes([[5]])
    routes[("GET", "/version")] = (200, "application/json", b'{"version":"1.2.1"}')
    with Replay(routes) as srv:
        e = create("trtllm", "/m/tiny", "bfloat16", {"url": srv.url})
        with pytest.raises(Exception) as err:
            await e.start()
    assert str(err.value) == ("trtllm 1.2.1 is not in the adapter's version table (known: 1.3.0rc24; "
                              "adapters/engines/trtllm/)")
