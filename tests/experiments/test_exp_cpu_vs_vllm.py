"""`experiments/configs/cpu_vs_vllm.toml` runs, at a reduced size: the config file itself, with
its workload shrunk, vLLM attached by URL to the test session's shared server (eager; the
config launches its own, compiled, which takes minutes on 2 cores) and only its first cell
(tiny, fp32; the four cells are checked to be the table's), both load shapes, the reference
engine's CPU fast path read back, greedy agreement with vLLM in fp32, and the matrix page.
The full-size numbers are a benchmark: docs/perf/cpu_vs_vllm.md."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from experiments.commands.run import run_main

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments/configs/cpu_vs_vllm.toml"


def _toml(d: dict, prefix: str = "") -> str:
    """Just enough TOML for the config's own shape (scalars, lists, one-level inline tables)."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v) if v != float("inf") else '"inf"'
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)
    flat = [f"{k} = {val(v)}" for k, v in d.items() if not isinstance(v, dict) or k == "make_model" or k == "env"]
    out = "\n".join(flat) + "\n"
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("make_model", "env"):
            out += f"\n[{prefix}{k}]\n" + _toml(v, f"{prefix}{k}.")
    return out


@pytest.mark.slow
@pytest.mark.vllm
def test_cpu_vs_vllm_config_runs_reduced(tmp_path, vllm_server):
    cfg = tomllib.loads(CONFIG.read_text())
    assert cfg["engines"] == ["reference", "vllm"] and cfg["load"]["rate"][0] == "inf"
    assert cfg["engine_options"]["vllm"]["launcher"] == ".venv-vllm"
    cfg["model"] = str(vllm_server.model)
    cfg.pop("make_model")
    assert [(c["name"], c.get("dtype", "float32")) for c in cfg["cells"][:4]] == [
        ("tiny-fp32", "float32"), ("tiny-bf16", "bfloat16"), ("small-fp32", "float32"), ("small-bf16", "bfloat16")]
    assert [(c["name"], c["engines"]) for c in cfg["cells"][4:6]] == [  # HF under the same Poisson loads
        ("tiny-fp32-hf", ["reference", "hf"]), ("small-fp32-hf", ["reference", "hf"])]
    real = {c["name"]: c for c in cfg["cells"][6:]}  # the real model: offline, served at 1, 4, 8, Poisson
    assert list(real) == ["smollm2-fp32-offline", "smollm2-fp32-served", "smollm2-fp32-served-modes",
                          "smollm2-bf16-served", "smollm2-fp32-poisson", "smollm2-fp32-served-vllm-thp"]
    assert real["smollm2-fp32-poisson"]["load"] == {"rate": [3.0]}  # the base's open loop, max_concurrency 8
    assert all(c["make_model"] == {"preset": "smollm2-135m-instruct"} for c in real.values())
    assert real["smollm2-fp32-offline"]["load"]["rate"] == ["inf"]
    # against vLLM: three interleaved repeats each; the reference's own layouts: a cell of their own
    for name in ("smollm2-fp32-offline", "smollm2-fp32-poisson"):
        assert real[name].get("engines", cfg["engines"]) == ["reference", "vllm"] and real[name]["repeats"] == 3
    # the served cell also runs the reference with its AVX2 kernels forced; the bf16 cell, bf16 on oneDNN beside the default's pair panels
    assert real["smollm2-fp32-served"]["engines"] == ["reference", "reference-avx2", "vllm"]
    assert real["smollm2-fp32-served"]["repeats"] == 3
    assert real["smollm2-bf16-served"]["engines"] == ["reference", "reference-onednn", "vllm"]
    assert real["smollm2-fp32-served-modes"]["engines"] == ["reference", "reference-thread", "reference-1t"]
    assert real["smollm2-fp32-served-modes"]["load"] == real["smollm2-fp32-served"]["load"]
    server = {"adapter": "reference", "mode": "server", "max_num_seqs": 128}
    assert cfg["engine_options"]["reference-thread"] == {**server, "num_threads": 2, "engine_process": False}
    assert cfg["engine_options"]["reference-1t"] == {**server, "num_threads": 1}
    assert cfg["engine_options"]["reference-avx2"] == {**server, "num_threads": 2, "env": {"ATEN_CPU_CAPABILITY": "avx2"}}
    assert cfg["engine_options"]["reference-onednn"] == {**server, "num_threads": 2,
                                                         "env": {"INFERLAB_LINEAR": "onednn"}}
    # vLLM with torch's huge-page switch beside vLLM as shipped (the reference puts its own weights on 2 MiB pages)
    assert real["smollm2-fp32-served-vllm-thp"]["engines"] == ["reference", "vllm", "vllm-thp"]
    assert cfg["engine_options"]["vllm-thp"] == {**cfg["engine_options"]["vllm"], "adapter": "vllm",
                                                 "env": {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "THP_MEM_ALLOC_ENABLE": "1"}}
    assert real["smollm2-fp32-served"]["load"] == real["smollm2-bf16-served"]["load"] == \
        real["smollm2-fp32-served-vllm-thp"]["load"] == {
        "mode": "closed", "concurrency": [1, 4, 8], "warmup": 2}
    assert cfg["cells"][0] == {"name": "tiny-fp32"}  # the base config as written: the model set above
    cfg["cells"] = cfg["cells"][:1]
    cfg["workload"].update(num_requests=6, input_len=16, output_len=8)
    cfg["load"].update(rate=["inf", 50.0], max_concurrency=2, warmup=1)
    cfg["kv"]["tokens"] = 4096
    cfg["engine_options"]["vllm"] = {"url": vllm_server.url}
    (tmp_path / "c.toml").write_text(_toml(cfg))
    assert run_main([str(tmp_path / "c.toml"), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    page = (tmp_path / "res/cpu_vs_vllm/report.md").read_text()
    assert "| tiny-fp32 | float32 | rate=inf | output tok/s | reference " in page and "reference ÷ best other" in page
    assert "| tiny-fp32 | float32 | rate=inf | TPOT p50 ÷ bandwidth floor | reference " in page  # the same run's floor
    run = tmp_path / "res/cpu_vs_vllm/tiny-fp32"
    report = (run / "report.md").read_text()
    for level in ("rate=inf", "rate=50"):
        assert f"| vllm | {level} | 6 | 1.000 | 1.000 |" in report  # fp32 greedy: identical tokens
    ref = json.loads((run / "reference/manifest.json").read_text())["info"]["effective"]
    assert ref["max_num_seqs"] == 128 and ref["num_threads"] == 2 and ref["dtype"] == "float32"
    from reference_engine.kernels import ops
    from reference_engine.model import packed_linear
    if packed_linear.onednn_available():
        assert ref["linear_backend"] == "onednn"
    if ops.available():
        assert ref["attention_backend"] == "cpu"
