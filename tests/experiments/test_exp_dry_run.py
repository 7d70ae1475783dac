"""`inferlab run CONFIG --dry-run` (experiments/commands/dry_run.py): the GPU configs dry-run clean on this
CPU machine, and each of issue 38's defects 1-4, planted back, makes it fail with one line naming
the engine, the field or flag, and the upstream source. vLLM's and SGLang's checks run their own
parsers in .venv-vllm / .venv-sglang (made by .ci/run)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from adapters.engines.trtllm import adapter as trtllm
from adapters.transport import launcher
from adapters.transport.openai import OpenAIEngine
from experiments.commands.run import run_main

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "experiments" / "configs"
GPU_CONFIGS = ["gpu_compare", "gpu_frontier", "compare_vllm", "compare_sglang", "compare_trtllm", "compare_tgi", "compare_reference"]


def on_model(name: str, model: Path, tmp_path: Path) -> Path:
    """The shipped config with its model replaced by `model` (as scripts/gpu_compare.sh's MODEL does)."""
    text = (CONFIGS / f"{name}.toml").read_text()
    text = re.sub(r'(?m)^model = .*$', f'model = "{model}"', text)
    text = re.sub(r"(?m)^make_model = .*$", "", text)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def dry(path: Path, capsys) -> tuple[int, str, str]:
    code = run_main([str(path), "--dry-run", "--out", str(path.parent / "results")])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_every_gpu_config_dry_runs_clean_and_shows_what_it_would_do(smollm2, tmp_path, capsys):
    outs = {}
    for name in GPU_CONFIGS:
        code, out, err = dry(on_model(name, smollm2, tmp_path), capsys)
        assert code == 0, (name, err, out)
        outs[name] = out
        for engine in re.findall(r"(?m)^== (\w+) \((?:vllm|sglang|trtllm|tgi),", out):
            block = out.split(f"== {engine} (")[1].split("\n== ")[0]
            for head in ("launch: ", "version: ", "request (first ", "metrics: ", "reads back: ", "check ok: "):
                assert head in block, (name, engine, head, block)
        assert not (tmp_path / "results").exists()  # nothing written, nothing started
    # the peers of gpu_compare.toml not installed here are shown through their pinned images, each
    # mounting the folder its option files go to (vLLM runs from .venv-vllm where that exists)
    out = outs["gpu_compare"]
    for image in ("lmsysorg/sglang:v0.5.23-cu130", "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24",
                  "text-generation-inference:3.3.7"):
        line = next(ln for ln in out.splitlines() if ln.startswith("launch: docker run") and image in ln)
        work = re.search(r"work dir: (\S+);", out.split(line)[1]).group(1)
        assert f"-v {work}:{work}" in line and f"-v {smollm2}:{smollm2}" in line


PEERS = """
name = "planted"
model = "{model}"
dtype = "{dtype}"
engines = {engines}
[engine_options.trtllm]
launcher = "docker run --gpus all --network host nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24"
[engine_options.tgi]
launcher = "docker run --gpus all --network host ghcr.io/huggingface/text-generation-inference:3.3.7"
[engine_options.sglang]
launcher = "docker run --gpus all --network host lmsysorg/sglang:v0.5.23-cu130"
enable_deterministic_inference = true
[workload]
kind = "chat"
template = "engine"
num_requests = 2
output_len = 8
[load]
concurrency = [1]
warmup = 0
[sampling]
temperature = 0.7
seed = 3
"""


def peers(model: Path, tmp_path: Path, dtype: str = "bfloat16", engines=("trtllm", "tgi")) -> Path:
    path = tmp_path / "planted.toml"
    path.write_text(PEERS.format(model=model, dtype=dtype, engines=list(engines)).replace("'", '"'))
    return path


@pytest.mark.slow
def test_the_chat_route_and_seeded_sampling_pass_as_built(smollm2, tmp_path, capsys):
    code, out, err = dry(peers(smollm2, tmp_path, engines=("trtllm", "tgi", "sglang")), capsys)
    assert code == 0, err + out
    assert "POST /v1/chat/completions" in out and '"detokenize"' not in out.split("POST /v1/chat/completions")[1]
    assert "--enable-deterministic-inference" in out  # and SGLang's own parser took it (the checks passed)


def one_failure(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("inferlab: dry run: ")]
    assert len(lines) >= 1, err
    return lines[0]


def test_defect_1_a_tags_reported_version_left_unmapped_fails(smollm2, tmp_path, capsys, monkeypatch):
    from dataclasses import replace

    from adapters.engines.tgi import adapter as tgi
    planted = replace(tgi.VERSIONS, reports={}, commits={})
    monkeypatch.setattr(tgi, "VERSIONS", planted)
    monkeypatch.setattr(tgi.TGIServer, "VERSIONS", planted)
    code, _, err = dry(peers(smollm2, tmp_path), capsys)
    line = one_failure(err)
    assert code == 2 and line.startswith("inferlab: dry run: FAIL: tgi: version '3.3.6-dev0' of v3.3.7")
    assert line.endswith("(Cargo.toml@v3.3.7)")


def test_defect_2_an_options_file_not_mounted_into_the_container_fails(smollm2, tmp_path, capsys, monkeypatch):
    real = launcher.Launcher.argv
    monkeypatch.setattr(launcher.Launcher, "argv", lambda self, **kw: real(self, **{**kw, "mounts": ()}))
    code, _, err = dry(peers(smollm2, tmp_path), capsys)
    line = one_failure(err)
    assert code == 2 and re.match(r"inferlab: dry run: FAIL: trtllm: file \S+/llm_api_options.yaml inside the "
                                  r"container: written on the host but not mounted", line), line


def test_defect_3_detokenize_on_the_chat_route_fails(smollm2, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(trtllm.TRTLLMServer, "_completion_body", OpenAIEngine._completion_body)
    code, _, err = dry(peers(smollm2, tmp_path), capsys)
    line = one_failure(err)
    assert code == 2 and line.startswith("inferlab: dry run: FAIL: trtllm: field detokenize on "
                                         "/v1/chat/completions (ChatCompletionRequest)"), line
    assert "forbids unknown fields" in line and "openai_protocol.py" in line


def test_defect_4_float32_fails_before_launch(smollm2, tmp_path, capsys, monkeypatch):
    code, _, err = dry(peers(smollm2, tmp_path, "float32"), capsys)  # the adapter refuses it at construction
    assert code == 2 and err.strip().splitlines()[-1].endswith("use one of bfloat16, float16")
    monkeypatch.setattr(trtllm, "check_dtype", lambda dtype: None)  # planted back: the dry run still catches it
    code, _, err = dry(peers(smollm2, tmp_path, "float32"), capsys)
    fails = [ln for ln in err.splitlines() if ln.startswith("inferlab: dry run: FAIL: trtllm: dtype float32")]
    assert code == 2 and fails and "llm_api_options" not in fails[0] and "llm_args.py@v1.3.0rc24" in fails[0]


def test_a_tgi_prefix_caching_switch_its_release_never_reads_fails(smollm2, tmp_path, capsys):
    """TGI v2.0.3 reads no PREFIX_CACHING (adapters/engines/tgi/upstream.json launcher_env_not_flags): the
    uniform prefix-caching setting would be dropped silently there; at 3.3.7 it is the switch."""
    text = peers(smollm2, tmp_path, engines=("tgi",)).read_text()
    text = text.replace("[engine_options.tgi]", "[engine_options.tgi]\nenable_prefix_caching = false")
    (tmp_path / "planted.toml").write_text(text)
    code, out, _ = dry(tmp_path / "planted.toml", capsys)
    assert code == 0 and "check ok: tgi: environment PREFIX_CACHING=0" in out
    (tmp_path / "planted.toml").write_text(text.replace("inference:3.3.7", "inference:2.0.3"))
    code, _, err = dry(tmp_path / "planted.toml", capsys)
    assert code == 2 and one_failure(err).startswith("inferlab: dry run: FAIL: tgi: environment PREFIX_CACHING=0: "
                                                     "not read anywhere")
