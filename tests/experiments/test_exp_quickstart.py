"""`inferlab run experiments/configs/quickstart.toml` end to end, as a user runs it from a
fresh folder (`make demo`): makes the real model (SmolLM2-135M-Instruct from its PyPI wheel, cached),
asks it real chat questions on the reference engine (server), the HF baseline and vLLM, and writes
report.md with every column filled, one answer per engine side by side and greedy agreement with
EOS on.

CI runs the quickstart's own config on four questions (`make demo` asks eight), at the same 1 and 4 concurrent
users: the same engines, model, template, sampling, KV pin and checks; one answer of the four ends at EOS."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QUESTIONS, LEVELS = 4, (1, 4)


def two_questions(out: Path) -> Path:
    """quickstart.toml with only its request count and concurrency levels changed (a line each)."""
    text = (REPO / "experiments/configs/quickstart.toml").read_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        key = line.split("=")[0].strip()
        if key == "num_requests":
            lines[i] = f"num_requests = {QUESTIONS}"
        elif key == "concurrency":
            lines[i] = f"concurrency = {list(LEVELS)}"
    assert sum(l.startswith(("num_requests =", "concurrency =")) for l in lines) == 2, "quickstart.toml changed shape"
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.mark.slow
@pytest.mark.longest  # ~3 minutes: started first (tests/conftest.py)
@pytest.mark.vllm  # runs vLLM too where .venv-vllm exists (CI): scheduled among the longest tests
def test_quickstart_end_to_end(tmp_path):
    vllm = (REPO / ".venv-vllm" / "bin" / "python").exists()
    if vllm:  # the quickstart's optional vLLM run finds `.venv-vllm` in the working directory
        (tmp_path / ".venv-vllm").symlink_to(REPO / ".venv-vllm")
    # vLLM in its default process layout (a model worker process of its own), as `make demo` runs it:
    # the one test that launches it so, and checks that the whole process tree is gone after.
    config = two_questions(tmp_path / "quickstart.toml")
    p = subprocess.run([sys.executable, "-m", "experiments.cli", "run", str(config), "--no-progress"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "results" / "quickstart"
    assert (tmp_path / "models/smollm2-135m-instruct/config.json").is_file()
    report = (run / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| level | metric |"))
    assert "| reference | hf |" in header
    for metric in ("TTFT mean (ms)", "TPOT median (ms)", "output tokens/s", "peak RSS, engine process tree (MiB)"):
        for level in LEVELS:
            row = next(line for line in report.splitlines() if line.startswith(f"| concurrency={level} | {metric} |"))
            cells = [c.strip() for c in row.strip("|").split("|")][2:4]
            # the median, with its 95 % interval when the level has one (repeats, or a request bootstrap)
            assert all(re.fullmatch(r"[\d,]+\.\d+( \[[\d,.]+–[\d,.]+\])?", c) for c in cells), row
    assert "Prompt token ids identical across engines (from requests.jsonl): yes" in report
    assert f"| hf | concurrency=1 | {QUESTIONS} | 1.000 | 1.000 |" in report  # greedy agreement against the reference engine
    # real answers that end at EOS, not max tokens: the Workload table counts them per engine
    ended = re.search(rf"\| reference \| concurrency=1 \| {QUESTIONS} \| (\d+) \| (\d+) \|", report)
    assert ended and int(ended[1]) >= 1, report[:3000]
    answers = report[report.index("## Answers, side by side"):report.index("## Effective settings")]
    assert "<|im_start|>user" in answers and "<|im_start|>assistant" in answers  # the chat template, visible
    ref = re.search(r"^\| reference \| (stop|length) \| (\d+) \| – \| (.+) \|$", answers, re.M)
    assert ref and len(ref[3].split()) >= 3 and "<|im_end|>" not in ref[3], answers  # words, no stop token's text
    assert re.search(r"^\| hf \| (stop|length) \| \d+ \| yes \| ", answers, re.M), answers
    assert "![cdf_ttft](plots/cdf_ttft.png)" in report and (run / "plots/cdf_ttft.png").is_file()
    m = json.loads((run / "reference/manifest.json").read_text())
    assert m["status"] == "ok" and m["info"]["mode"] == "server" and m["info"]["kv_capacity_tokens"] == 4096
    assert m["same_process"] is False and m["git_commit"] and m["hardware"]["cores_logical"] >= 1
    hf = json.loads((run / "hf/manifest.json").read_text())
    assert hf["same_process"] is False and hf["info"]["mode"] == "own_process"  # in-process adapters get their own process
    assert "| hf (naive baseline) | ok | own_process |" in report
    if vllm:  # vLLM for real, through the harness: same greedy tokens, pinned KV, server gone after
        import psutil

        v = json.loads((run / "vllm/manifest.json").read_text())
        assert v["status"] == "ok" and v["info"]["kv_capacity_tokens"] == 4096 and v["kv_pinned"] is True
        assert not psutil.pid_exists(v["info"]["pid"]) or psutil.Process(v["info"]["pid"]).status() == "zombie"
        for level in LEVELS:
            assert f"| vllm | concurrency={level} | {QUESTIONS} | 1.000 | 1.000 |" in report
        assert "| vllm | ok | server | 0.32.0 | float32 | 1 / 1 | 4096 | yes |" in report
        # the server's own view beside ours: vLLM's histograms counted exactly the measured requests
        for level in LEVELS:
            assert re.search(rf"\| vllm \| concurrency={level} \| TTFT \| [\d.,]+ \| [\d.,]+ \| .* \| {QUESTIONS} counted \|",
                             report), level
        assert f"| vllm | stop |" in answers or f"| vllm | length |" in answers
