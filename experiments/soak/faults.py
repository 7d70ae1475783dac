"""How long `inferlab serve` takes to end under each fault the tests check (issue 42), as a table
for docs/perf/. The tests assert what happens (exit codes, error events, nothing left behind);
this measures how fast, which is a benchmark's verdict, not a test's.

    python -m experiments.soak.faults MODEL_DIR [--repeats 3]

Cases: kill -9 of the engine core (exit 1), SIGSTOP of the core with --engine-step-timeout 2
(watchdog, exit 1), SIGTERM and SIGINT while the model loads (a FIFO config.json stands for a
load that never ends), SIGTERM during a drain and a second SIGTERM, SIGTERM 0.5 s after launch.
Seconds from the fault (signal sent) to the server's exit; the median of the repeats.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]
STREAM = {"prompt": [1, 2, 3, 4], "max_tokens": 2000, "temperature": 0, "ignore_eos": True, "stream": True}


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model: Path, *flags: str, wait: bool = True) -> tuple[subprocess.Popen, str]:
    p = port()
    proc = subprocess.Popen([sys.executable, "-m", "reference_engine.server", str(model), "--port", str(p),
                             "--log-level", "warning", "--max-model-len", "2048", *flags], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{p}"
    while wait:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    return proc, url


def core(proc) -> psutil.Process:
    while not psutil.Process(proc.pid).children():
        time.sleep(0.01)
    return psutil.Process(proc.pid).children()[0]


def streaming(url: str):
    """A stream that has produced its first token: (the context, its line iterator), both kept by the
    caller (a dropped iterator closes the response, and the drain would have nothing to wait for)."""
    cm = httpx.stream("POST", url + "/v1/completions", json=STREAM, timeout=120)
    lines = cm.__enter__().iter_lines()
    next(line for line in lines if line.startswith("data: {"))
    return cm, lines


def timed_exit(proc, act) -> tuple[float, int]:
    t = time.monotonic()
    act()
    code = proc.wait(120)
    return time.monotonic() - t, code


def case_kill(model):
    proc, url = serve(model)
    cm, lines = streaming(url)
    out = timed_exit(proc, core(proc).kill)
    cm.__exit__(None, None, None)
    return out


def case_watchdog(model):
    proc, url = serve(model, "--engine-step-timeout", "2")
    cm, lines = streaming(url)
    out = timed_exit(proc, core(proc).suspend)
    cm.__exit__(None, None, None)
    return out


def case_load(model, sig):
    def run(_model):
        with tempfile.TemporaryDirectory() as d:
            os.mkfifo(Path(d) / "config.json")
            proc, _ = serve(Path(d), wait=False)
            core(proc)
            return timed_exit(proc, lambda: proc.send_signal(sig))
    return run


def case_drain(model):
    proc, url = serve(model, "--shutdown-timeout", "600")
    cm, lines = streaming(url)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    out = timed_exit(proc, lambda: proc.send_signal(signal.SIGTERM))
    cm.__exit__(None, None, None)
    return out


def case_early(model):
    proc, _ = serve(model, wait=False)
    time.sleep(0.5)
    return timed_exit(proc, lambda: proc.send_signal(signal.SIGTERM))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.soak.faults", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    cases = [("kill -9 of the core, a stream open", case_kill),
             ("SIGSTOP of the core, --engine-step-timeout 2", case_watchdog),
             ("SIGTERM while the model loads", case_load(a.model, signal.SIGTERM)),
             ("SIGINT while the model loads", case_load(a.model, signal.SIGINT)),
             ("second SIGTERM during a drain", case_drain),
             ("SIGTERM 0.5 s after launch", case_early)]
    print("| fault | exit code | seconds to exit (median) | all repeats |\n|---|---|---|---|")
    for name, fn in cases:
        runs = [fn(a.model) for _ in range(a.repeats)]
        codes = sorted({c for _, c in runs})
        secs = [s for s, _ in runs]
        print(f"| {name} | {', '.join(map(str, codes))} | {statistics.median(secs):.2f} | "
              f"{' '.join(f'{s:.2f}' for s in secs)} |", flush=True)


if __name__ == "__main__":
    main()
