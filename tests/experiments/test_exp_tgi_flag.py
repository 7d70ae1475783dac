"""A TGI run whose requests stop at EOS before max_new_tokens (TGI has no `ignore_eos`) is
flagged in the report. The TGI adapter talks to our own server's TGI routes; the model's EOS
is set to a token it emits greedily, so some requests really stop early."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter

import pytest

from experiments.workload.config import Workload
from experiments.workload.workloads import build
from tests.adapters.own_server import inferlab_serve
from tests.experiments.exp_util import write_config

WORKLOAD = Workload(kind="random", num_requests=6, input_len=12, output_len=16, seed=3)


def _eos_model(model_dir, dest):
    """A copy of the model (weights hard-linked) whose EOS is its most frequent greedy output token."""
    from reference_engine import LLM, SamplingParams

    items, _ = build(model_dir, WORKLOAD, 0)
    llm = LLM(str(model_dir))
    # TGI takes text: the server re-encodes the decoded prompt (and adds BOS, as TGI would)
    prompts = [llm.tokenizer.encode(llm.tokenizer.decode(i.prompt_token_ids)) for i in items]
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    eos, _ = Counter(t for o in outs for t in o.token_ids[:-1]).most_common(1)[0]
    shutil.copytree(model_dir, dest, copy_function=os.link)
    for name in ("config.json", "generation_config.json"):
        cfg = json.loads((model_dir / name).read_text())
        cfg["eos_token_id"] = eos
        (dest / name).unlink()  # hard link: write a new file, never the shared one
        (dest / name).write_text(json.dumps(cfg))
    return dest


@pytest.mark.slow
async def test_report_flags_tgi_rows_that_stopped_early(exp_model, tmp_path):
    model = _eos_model(exp_model, tmp_path / "eos-model")
    async with inferlab_serve(model, tmp_path) as url:
        cfg = write_config(tmp_path / "tgi.toml", model, f"""
            engine = "tgi"
            [engine_options.tgi]
            url = "{url}"
            [workload]
            kind = "random"
            num_requests = {WORKLOAD.num_requests}
            input_len = {WORKLOAD.input_len}
            output_len = {WORKLOAD.output_len}
            seed = {WORKLOAD.seed}
            [load]
            mode = "closed"
            concurrency = [2]
            warmup = 0
            """, name="tgi_flag")
        proc = subprocess.run([sys.executable, "-m", "experiments.cli", "run", str(cfg), "--out", str(tmp_path / "out"),
                               "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = (tmp_path / "out" / "tgi_flag" / "report.md").read_text()
    assert "stopped before max_tokens" in report and "TGI has no `ignore_eos`" in report
    lines = [json.loads(x) for x in (tmp_path / "out" / "tgi_flag" / "tgi" / "requests.jsonl").read_text().splitlines()]
    assert any(len(r["output_token_ids"]) < 16 and r["finish_reason"] == "stop" for r in lines)
    assert "ran inside the harness's interpreter" not in report  # attached: the engine is another process
    assert "was attached to a server started elsewhere" in report
    manifest = json.loads((tmp_path / "out" / "tgi_flag" / "tgi" / "manifest.json").read_text())
    assert manifest["kv_pinned"] is False
