"""A served decode, closed loop, and where the server process spends it (py-spy, per thread and process).

Starts `python -m reference_engine.server MODEL` once per setting (extra server flags after `--`,
several settings separated by `--also`), drives it with C streaming clients in a closed loop
(N requests of P random prompt ids -> O tokens, greedy, ignore_eos), and prints client-side TTFT and
TPOT medians; with `--spy PY_SPY` it samples the server (and its children) during the measured
requests and prints the top frames by own samples and by inclusive samples, per thread.

    .venv/bin/python scripts/profile_served.py MODEL --conc 1 4 [--n 12] [--rounds 2] [--spy /tmp/spyenv/bin/py-spy]
        [-- --engine-process --also --no-engine-process]

Settings run in alternation (round 1: A B, round 2: A B, ...): on a shared machine compare them as
ratios within one invocation. Numbers are medians over the requests of each round.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import aiohttp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str, flags: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "reference_engine.server", model, "--port", str(port), "--log-level", "warning",
           "--max-num-seqs", "16", "--kv-cache-tokens", "16384", *flags]
    proc = subprocess.Popen(cmd, start_new_session=False)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"server exited: {cmd}")
            time.sleep(0.25)
    raise SystemExit("server did not start")


async def one(session, url: str, ids: list[int], out: int) -> tuple[float, float]:
    body = {"prompt": ids, "max_tokens": out, "temperature": 0.0, "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    first = last = None
    n = 0
    async with session.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data:") and b'"text"' in line:
                last = time.perf_counter()
                first = first or last
                n += 1
    return (first - t0) * 1e3, (last - first) * 1e3 / max(1, n - 1)  # TTFT, TPOT (one token per event)


async def closed_loop(url: str, conc: int, prompts: list[list[int]], out: int) -> list[tuple[float, float]]:
    todo, res = list(prompts), []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        async def worker():
            while todo:
                res.append(await one(s, url, todo.pop(), out))
        await asyncio.gather(*(worker() for _ in range(conc)))
    return res


def spy_top(path: str, k: int = 12) -> str:
    """py-spy raw (collapsed) stacks -> top frames by own and by inclusive samples, per thread."""
    own, incl, threads = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for line in open(path):
        stack, _, n = line.rstrip().rpartition(" ")
        n = int(n)
        frames = stack.split(";")
        total += n
        threads[frames[0]] += n
        own[frames[-1]] += n
        for f in set(frames[1:]):
            incl[f] += n
    rows = [f"samples {total}; per thread: " + ", ".join(f"{t} {c / total:.0%}" for t, c in threads.most_common(6))]
    rows += ["own:"] + [f"  {c / total:6.1%}  {f[:150]}" for f, c in own.most_common(k)]
    rows += ["inclusive:"] + [f"  {c / total:6.1%}  {f[:150]}" for f, c in incl.most_common(k)]
    return "\n".join(rows)


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--conc", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--out", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--spy", default=None)
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    settings, cur = [], []
    for x in extra:
        if x == "--also":
            settings.append(cur)
            cur = []
        else:
            cur.append(x)
    settings.append(cur)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 49000) for _ in range(a.prompt)] for _ in range(a.n)]
    results = collections.defaultdict(list)
    for rnd in range(a.rounds):
        for flags in settings:
            proc, url = start(a.model, flags)
            try:
                asyncio.run(closed_loop(url, 2, prompts[:2], a.out))  # warm-up
                for c in a.conc:
                    spy = None
                    if a.spy and rnd == 0:
                        raw = f"/tmp/spy_{'_'.join(flags) or 'default'}_c{c}.txt".replace("--", "")
                        spy = subprocess.Popen([a.spy, "record", "--pid", str(proc.pid), "--rate", "250", "--threads",
                                                "--subprocesses", "--nonblocking", "--format", "raw", "-o", raw],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        time.sleep(1.0)
                    res = asyncio.run(closed_loop(url, c, prompts, a.out))
                    if spy:
                        spy.send_signal(signal.SIGINT)
                        spy.wait(30)
                        print(f"\n### py-spy, server {' '.join(flags) or '(defaults)'}, concurrency {c}\n{spy_top(raw)}")
                    ttft = sorted(r[0] for r in res)[len(res) // 2]
                    tpot = sorted(r[1] for r in res)[len(res) // 2]
                    results[(" ".join(flags) or "(defaults)", c)].append((ttft, tpot))
                    print(f"round {rnd + 1} {' '.join(flags) or '(defaults)'} c={c}: TTFT p50 {ttft:.1f} ms, "
                          f"TPOT p50 {tpot:.2f} ms", flush=True)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
    print("\n" + json.dumps({f"{k[0]} c={k[1]}": v for k, v in results.items()}))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
