"""Kernel settings that cannot hold on this machine are refused when the engine is built, in one line
naming the setting, its value and why, instead of failing every step they would serve. The machine's
CPU and compiler are injected (pin_problem's `isa` / `cxx`, or the real overrides torch reads:
ATEN_CPU_CAPABILITY, CXX), so these run alike on CPUs with and without AVX-512."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from reference_engine import LLM, SamplingParams
from reference_engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.kernels import ops
from reference_engine.model.packed_linear import GONE, linear_kernel, pin_problem

PINS = ("INFERLAB_LINEAR", *GONE, "INFERLAB_FUSED_DECODE", "INFERLAB_AMX")


@pytest.fixture
def pins(monkeypatch):
    """Set pins for one test; the cached choices are read afresh before and after it."""
    for var in PINS:
        monkeypatch.delenv(var, raising=False)
    linear_kernel.cache_clear()
    yield monkeypatch
    linear_kernel.cache_clear()


def test_each_impossible_pin_is_one_line_naming_it_its_value_and_why():
    why = pin_problem("INFERLAB_LINEAR", "inferlab", cxx=None)
    assert why.startswith("INFERLAB_LINEAR=inferlab needs a C++ compiler") and "\n" not in why
    assert pin_problem("INFERLAB_LINEAR", "blas") == "INFERLAB_LINEAR='blas': expected 'inferlab' or 'onednn'"
    assert pin_problem("INFERLAB_LINEAR", "onednn") is None  # oneDNN runs wherever torch has it
    for var in GONE:  # the three-layout design's pins: named, not silently ignored
        assert pin_problem(var, "onednn").startswith(f"{var}='onednn': no longer exists (one weight layout")
    # this machine, as it is: the kernel pin holds exactly where the kernel builds and loads
    assert (pin_problem("INFERLAB_LINEAR", "inferlab") is None) == ops.available()


def test_the_engine_refuses_a_pin_without_a_compiler_before_loading_anything(tiny_llama, pins):
    pins.setenv("INFERLAB_LINEAR", "inferlab")
    pins.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(ValueError, match=r"^INFERLAB_LINEAR=inferlab needs a C\+\+ compiler .*"
                                         r"CXX=/nonexistent/c\+\+ is not on PATH"):
        LLMEngine(EngineConfig(model=str(tiny_llama), kv_cache_tokens=256))


def test_a_switch_with_a_value_that_means_nothing_is_refused(tiny_llama, pins):
    pins.setenv("INFERLAB_FUSED_DECODE", "false")  # would have left the fast path on
    with pytest.raises(ValueError, match="INFERLAB_FUSED_DECODE='false': expected '0'"):
        LLMEngine(EngineConfig(model=str(tiny_llama), kv_cache_tokens=256))


REFUSED = """
import sys
from reference_engine import LLMEngine, EngineConfig
try:
    LLMEngine(EngineConfig(model=sys.argv[1], attention_backend="cpu", fused_ops=True, kv_cache_tokens=256))
except ValueError as e:
    print(e)
    sys.exit(2)
"""


def test_without_a_compiler_every_impossible_setting_is_named_at_start(tiny_llama, tmp_path):
    """torch's own override makes this CPU an AVX2 one (ATEN_CPU_CAPABILITY: every kernel has AVX2 code,
    so that alone refuses nothing), CXX one without a compiler; the engine names all four settings in
    one line and builds nothing."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "CXX": "/nonexistent/c++", "INFERLAB_CACHE": str(tmp_path),
           "INFERLAB_LINEAR": "inferlab", "INFERLAB_DECODE_GEMV": "inferlab", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", REFUSED, str(tiny_llama)], env=env, capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    line = run.stdout.strip()
    assert "\n" not in line
    assert "INFERLAB_LINEAR=inferlab needs a C++ compiler" in line
    assert "INFERLAB_DECODE_GEMV='inferlab': no longer exists" in line
    assert "attention_backend='cpu'" in line and "fused_ops=True" in line
    assert not any(tmp_path.iterdir())  # no kernel was built, or tried


def test_a_pin_that_can_hold_still_works(tiny_llama, pins):
    kernel = "inferlab" if ops.available() else "onednn"
    pins.setenv("INFERLAB_LINEAR", kernel)
    llm = LLM(str(tiny_llama), kv_cache_tokens=1024, max_num_seqs=16)
    assert llm.engine.effective_config()["linear_kernel"] == kernel
    outs = llm.generate([[1, 2, 3 + i] for i in range(14)], SamplingParams(max_tokens=3, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [3] * 14


def test_an_amx_switch_that_means_nothing_is_refused(tiny_llama, pins):
    pins.setenv("INFERLAB_AMX", "off")  # would have left AMX on
    with pytest.raises(ValueError, match="INFERLAB_AMX='off': expected '0' \\(off\\) or '1'"):
        LLMEngine(EngineConfig(model=str(tiny_llama), kv_cache_tokens=256))
