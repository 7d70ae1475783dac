"""TensorRT-LLM adapter: trtllm-serve command line and options file, KV from Prometheus names,
and the OpenAI routes of our own server (no recorded trtllm-serve response was found)."""
from __future__ import annotations

import json
import sys

import pytest

from adapters import prom
from adapters.base import EngineUnavailable
from adapters.trtllm import TRTLLMEngine
from tests.adapters.adapter_util import random_prompts, reference_greedy, run_all, tokens
from tests.adapters.own_server import inferlab_serve
from tests.adapters.test_tgi import fake_venv


def test_server_argv_and_options_file(tmp_path):
    e = TRTLLMEngine("/models/llama", "bfloat16", {"launcher": str(tmp_path / "venv"), "kv_cache_tokens": 8192,
                                                   "kv_cache_free_gpu_memory_fraction": 0.9, "max_batch_size": 64})
    s = e._impl.server
    (tmp_path / "venv").mkdir()
    s.launcher, s.port, s.work_dir = fake_venv(tmp_path / "venv", "trtllm-serve"), 8000, tmp_path
    assert e._impl.server_argv() == [
        str(tmp_path / "venv" / "bin" / "trtllm-serve"), "/models/llama", "--host", "127.0.0.1", "--port", "8000",
        "--kv_cache_free_gpu_memory_fraction", "0.9", "--max_batch_size", "64",
        "--extra_llm_api_options", str(tmp_path / "llm_api_options.yaml")]
    assert json.loads((tmp_path / "llm_api_options.yaml").read_text()) == {"kv_cache_config": {"max_tokens": 8192}}
    assert e._impl.metrics_path == "/prometheus/metrics"


def test_kv_capacity_from_trtllm_gauges():
    # Constructed text (not recorded) with the gauge names trtllm-serve documents.
    m = prom.Metrics.parse('trtllm_kv_cache_max_blocks{model_name="m",engine_type="pytorch"} 512.0\n'
                           'trtllm_kv_cache_tokens_per_block{model_name="m",engine_type="pytorch"} 32.0\n')
    e = TRTLLMEngine("m", "float32", {"url": "http://127.0.0.1:1"})
    assert e._impl._kv_capacity(m) == (16384, 32)
    assert e._impl._kv_capacity(prom.Metrics.parse("")) == (None, None)


async def test_missing_trtllm_is_engine_unavailable(tmp_path):
    e = TRTLLMEngine("m", "float32", {"launcher": sys.executable, "work_dir": str(tmp_path)})
    with pytest.raises(EngineUnavailable, match="trtllm-serve.*pypi.nvidia.com"):
        await e.start()
    with pytest.raises(EngineUnavailable, match="tensorrt_llm"):
        await TRTLLMEngine("m", "float32", {"mode": "in_process"}).start()


@pytest.mark.slow
async def test_against_our_own_openai_routes(tiny_llama, tmp_path):
    from reference_engine import LLM

    prompts = random_prompts(tiny_llama, 3, seed=5)
    async with inferlab_serve(tiny_llama, tmp_path) as url:
        e = TRTLLMEngine(str(tiny_llama), "float32", {"url": url})
        info = await e.start()
        runs = await run_all(e, prompts, 12, ignore_eos=True)
        assert await e.reset_prefix_cache() is False
        await e.stop()
    assert info.mode == "attach" and info.knobs["events_carry_token_ids"] is True
    assert info.kv_capacity_tokens is None  # our server has no /prometheus/metrics: unknown, not guessed
    ref = reference_greedy(LLM(str(tiny_llama)), prompts, 12)
    assert [tokens(r) for r in runs] == [list(o.token_ids) for o in ref]
