"""Issue 27: the harness's one `max_model_len` reaches each engine as that engine's own flag, and each
adapter reads the effective value back from what the engine reports (contract tests on argv and on
recorded report shapes, as the other adapter tests). TGI's is in test_tgi.py (the only file that
imports its adapter)."""
from __future__ import annotations

import json
import sys

import pytest

from adapters.common.readback import ReadBack, vllm_server_info
from adapters.engines.sglang.settings import read_back as sglang_read_back
from adapters.engines.trtllm.adapter import metrics_read_back
from adapters.registry import create
from adapters.transport import prom
from adapters.transport.launcher import Launcher, engine_error
from tests.adapters.test_trtllm import fake_venv
from tests.adapters.test_vllm import fake_package

N = 384


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_vllm_gets_max_model_len_and_reads_it_back(tiny_llama, tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, "vllm")
    e = create("vllm", str(tiny_llama), "float32", {"launcher": sys.executable, "max_model_len": N})
    e.server.launcher, e.server.port = Launcher.parse(sys.executable), 8123
    assert _after(e.server_argv(), "--max-model-len") == str(N)
    rb = ReadBack()
    vllm_server_info(rb, {"model_config": {"max_model_len": N}})  # /server_info's resolved config
    assert rb.effective["max_model_len"] == N


def test_reference_server_gets_max_model_len(tiny_llama):
    impl = create("reference", str(tiny_llama), "float32", {"mode": "server", "max_model_len": N, "port": 5555})
    impl.server.launcher = Launcher.parse(None)
    assert _after(impl.server_argv(), "--max-model-len") == str(N)


def test_reference_in_process_reads_back_its_max_model_len(tiny_llama):
    import asyncio

    async def go():
        e = create("reference", str(tiny_llama), "float32", {"mode": "in_process", "max_model_len": N})
        info = await e.start()
        await e.stop()
        return info

    assert asyncio.run(go()).effective["max_model_len"] == N


def test_sglang_gets_context_length_and_reads_it_back(tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, "sglang")
    e = create("sglang", "/m/qwen", "bfloat16", {"launcher": sys.executable, "max_model_len": N})
    e.server.launcher, e.server.port = Launcher.parse(sys.executable), 30000
    assert _after(e.server_argv(), "--context-length") == str(N)
    assert sglang_read_back({"context_length": N})[0]["max_model_len"] == N  # /server_info


def test_trtllm_gets_max_seq_len_and_reads_it_back(tmp_path):
    (tmp_path / "venv").mkdir()
    e = create("trtllm", "/models/llama", "bfloat16", {"launcher": str(tmp_path / "venv"), "max_model_len": N})
    s = e.server
    s.launcher, s.port, s.work_dir = fake_venv(tmp_path / "venv", "trtllm-serve"), 8000, tmp_path
    assert _after(e.server_argv(), "--max_seq_len") == str(N)
    m = prom.Metrics.parse(f'trtllm_model_config_info{{model="m",dtype="bfloat16",max_model_len="{N}"}} 1.0\n')
    rb = ReadBack()
    metrics_read_back(rb, m, "/prometheus/metrics")
    assert rb.effective["max_model_len"] == N
    with pytest.raises(ValueError, match="contradict"):
        create("trtllm", "/models/llama", "bfloat16", {"launcher": str(tmp_path), "max_model_len": N, "max_seq_len": 8})


VLLM_LOG = """$ python -m vllm.entrypoints.openai.api_server --model m
(EngineCore_DP0 pid=11) ERROR 12-02 07:01:02 [core.py:700] EngineCore failed to start.
(EngineCore_DP0 pid=11) Traceback (most recent call last):
(EngineCore_DP0 pid=11)   File "vllm/v1/core/kv_cache_utils.py", line 700, in check_enough_kv_cache_memory
(EngineCore_DP0 pid=11) ValueError: To serve at least one request with the model's max seq len (8192), 0.35 GiB KV cache is needed
Traceback (most recent call last):
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_engine_error_is_the_root_cause_line():
    assert engine_error(VLLM_LOG) == ("ValueError: To serve at least one request with the model's max seq len "
                                      "(8192), 0.35 GiB KV cache is needed")
    assert engine_error("INFO starting\nall good\n") is None
    assert json.dumps(engine_error(VLLM_LOG)).count("\\n") == 0
