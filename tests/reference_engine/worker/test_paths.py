"""worker/paths: the dispatch table says which path runs, agrees with what the profiler sees run, is read
back in effective_config, and is what `inferlab serve --explain-paths` prints."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from torch.profiler import profile

from reference_engine import LLM, SamplingParams
from reference_engine.kernels import ops
from reference_engine.worker import paths

builds = pytest.mark.skipif(not ops.available(), reason="the C++ kernels do not build here")


def _steps(engine, prompts: list[list[int]], max_tokens: int) -> list[set[str]]:
    """The inferlab kernel regions the profiler saw in each step (both prompts prefill in the first)."""
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    seen = []
    while engine.has_unfinished():
        with profile() as prof:
            engine.step()
        seen.append({e.name for e in prof.events() if e.name.startswith("inferlab::")})
    return seen


@builds
def test_the_table_agrees_with_the_kernels_that_run(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32")
    runner = llm.engine.runner
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    steps = _steps(llm.engine, prompts, 4)
    prefill, decodes = steps[0], steps[1:]
    assert len(decodes) == 3
    # the first step prefills: the table says modules (+ the prefill attention kernel), and so does the profiler
    assert paths.layer_path(runner, 7, False)[0] == "modules"
    assert "inferlab::decode_layer" not in prefill and "inferlab::attention_prefill" in prefill
    # a decode of 2 rows: the table says the one-call layer, and only that layer's region runs
    assert paths.layer_path(runner, 2, True)[0] == "fused C++ layer"
    assert all("inferlab::decode_layer" in names for names in decodes)
    # the projections: the panel GEMM on every shape (one layout), seen in the prefill step
    assert all(r.linear.startswith("panel GEMM") for r in paths.routes(runner))
    assert "inferlab::linear" in prefill
    llm.close()


@builds
def test_limits_and_refusals_are_named(tiny_llama, monkeypatch):
    llm = LLM(str(tiny_llama), dtype="float32")
    runner = llm.engine.runner
    limit = runner.fast_decode.max_rows
    assert paths.layer_path(runner, limit, True)[0] == "fused C++ layer"
    layer, why = paths.layer_path(runner, limit + 1, True)
    assert layer == "modules" and str(limit) in why
    eff = llm.engine.effective_config()["paths"]
    assert eff == paths.settings(runner)
    assert eff["fused_decode"] and eff["fused_decode_max_rows"] == limit and eff["isa"] in ("AVX512", "AVX2", "DEFAULT")
    llm.close()
    monkeypatch.setenv("INFERLAB_FUSED_DECODE", "0")
    off = LLM(str(tiny_llama), dtype="float32")
    s = paths.settings(off.engine.runner)
    assert not s["fused_decode"] and "INFERLAB_FUSED_DECODE=0" in s["fused_decode_refusal"]
    assert s["pins"]["INFERLAB_FUSED_DECODE"] == "0"
    assert paths.layer_path(off.engine.runner, 1, True) == ("modules", s["fused_decode_refusal"])
    off.close()


@builds
def test_explain_paths_prints_the_table_for_the_isa_asked(tiny_llama):
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "reference_engine.server", str(tiny_llama), "--dtype", "float32",
                          "--explain-paths"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "ISA AVX2" in out.stdout and "| decode x1 | fused C++ layer | panel GEMM (AVX2) |" in out.stdout
    assert "ATEN_CPU_CAPABILITY=avx2" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "reference_engine.server", str(tiny_llama), "--explain-paths",
                          "--max-num-seqs", "0"], capture_output=True, text=True, env=env, timeout=600)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
