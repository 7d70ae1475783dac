"""`make soak`: a bounded soak of `inferlab serve` on the real model, judged on what must not drift.

Starts `inferlab serve MODEL` itself (prefix caching on, n-gram speculation on, `--max-model-len`
1024 by default so that a prompt filling the context costs seconds, not tens of seconds, on a CPU),
sends each context-filling passage once (their cold prefill, seconds each, is not measured), finds
the saturation rate with a short SLO search over the soak's own traffic (experiments/soak/load.py;
or takes `--rate` / SOAK_RATE), sends the greedy probes, then soaks for `--minutes` (SOAK_MIN,
default 30) at that rate with the mix of experiments/soak/mix.py (chat, multi-turn, context-filling
prompts, 10 % of the streams cut, 5 % invalid requests, n > 1, logprobs; one latency window's
arrivals, replayed every window), sampling RSS, KV blocks in use and latency every `--sample-s` seconds. Then it lets the server go idle, reads its KV blocks,
sends the probes again, stops the server and writes `<out>/<date>-soak.md` with its plot
(`<date>-soak.png`); the raw requests, samples and server log go to `--run-dir` (default
results/soak/<timestamp>/, outside git). Verdicts and windows: experiments/soak/verdict.py.

    python -m experiments.soak [--minutes 30] [--rate R] [--model DIR] [--out docs/perf] [--mechanism]

`--mechanism` (the CI run, tests/experiments/test_exp_soak.py) prints the timing verdicts (RSS slope,
latency drift) as SKIP with their numbers. Exit code: the number of MISS verdicts; 2 on a setup error.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # also when run by path, not with -m from the repo root

from adapters.transport.launcher import ServerProcess, ServerStartError, free_port  # noqa: E402
from experiments.running import results  # noqa: E402
from experiments.soak import client, load, report, verdict  # noqa: E402
from experiments.soak.mix import DECK, Mix, Req, probe_requests  # noqa: E402
from experiments.soak.observe import Sampler, scrape, wait_idle  # noqa: E402

DEFAULT_MODEL = "models/smollm2-135m-instruct"
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def parse(argv: list[str]) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog="python -m experiments.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=float(env.get("SOAK_MIN") or 30), help="default: $SOAK_MIN or 30")
    p.add_argument("--rate", type=float, default=float(env["SOAK_RATE"]) if env.get("SOAK_RATE") else None,
                   help="req/s; default $SOAK_RATE, else the SLO search's")
    p.add_argument("--model", default=DEFAULT_MODEL, help="HF-format model directory (make soak makes the real one)")
    p.add_argument("--out", type=Path, default=REPO / "docs/perf", help="where the page and its plot go")
    p.add_argument("--run-dir", type=Path, default=None, help="raw data; default results/soak/<timestamp>")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-cache-tokens", type=int, default=16384)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--start-rate", type=float, default=0.5, help="the search's first level (req/s)")
    p.add_argument("--search-levels", type=int, default=5)
    p.add_argument("--search-level-s", type=float, default=60.0)
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=150.0)
    p.add_argument("--goodput", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mechanism", action="store_true", help="CI: timing verdicts printed, not judged")
    return p.parse_args(argv)


def server_argv(args: argparse.Namespace, port: int) -> list[str]:
    exe = Path(sys.executable).parent / "inferlab"  # the console script beside this interpreter
    serve = [str(exe), "serve"] if exe.exists() else [sys.executable, "-m", "reference_engine.server"]
    return [*serve, args.model, "--port", str(port), "--enable-prefix-caching", "--speculative-config",
            json.dumps(SPEC), "--max-model-len", str(args.max_model_len), "--kv-cache-tokens",
            str(args.kv_cache_tokens), "--log-level", "warning"]


async def get_json(http, url: str) -> dict:
    async with http.get(url) as resp:
        return await resp.json()


async def probes(http, base: str, served: str, records: list[dict]) -> list[list[int]]:
    """The fixed greedy probes, one at a time; their token ids ([] for a failed one)."""
    out = []
    for path, body in probe_requests(served):
        rec = await client.send(http, base, Req("probe", path=path, body=body))
        records.append(rec)
        out.append(rec["output_token_ids"] if rec["status"] == 200 and rec["done"] else [])
    return out


class Log:
    def __init__(self, path: Path):
        self.path = path

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        with self.path.open("a") as f:
            f.write(line + "\n")


async def pick_rate(args, http, base: str, mix: Mix, records: list[dict], log: Log) -> tuple[float, dict | None, str]:
    if args.rate is not None:
        return args.rate, None, f"{args.rate:g} req/s, given (--rate / SOAK_RATE); no search."
    slo = {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms, "e2el_ms": None}
    s = await load.search_rate(http, base, mix, slo, args.start_rate, args.search_levels, args.search_level_s,
                               args.goodput, records.append, log)
    if s["best_rate"] is not None:
        return s["best_rate"], s, (f"{s['best_rate']:g} req/s: the search's highest passing rate"
                                   + (f" ({s['failing_rate']:g} req/s failed)." if s["failing_rate"] else
                                      " (no level failed: the saturation rate is higher)."))
    rate = min(p["rate"] for p in s["points"]) / 2
    return rate, s, (f"{rate:g} req/s: no level passed, so half the lowest rate tried "
                     "(the server is slower than the SLO).")


async def soak(args, run_dir: Path, log: Log) -> dict:
    port = free_port()
    base, argv = f"http://127.0.0.1:{port}", server_argv(args, port)
    srv = ServerProcess(argv, {}, run_dir / "server.log", f"http://127.0.0.1:{port}/health")
    log(f"$ {shlex.join(argv)}")
    await srv.start(timeout_s=600)
    records: list[dict] = []
    ctx: dict = {"server_command": shlex.join(argv), "records": records}
    try:
        async with client.session() as http:
            served = (await get_json(http, base + "/v1/models"))["data"][0]["id"]
            eff = (await get_json(http, base + "/server_info"))["effective"]
            mix = Mix(args.model, served, eff["max_model_len"], args.seed)
            for req in mix.warmup():  # one at a time, before anything is measured
                records.append(await client.send(http, base, req))
            rate, ctx["search"], ctx["rate_note"] = await pick_rate(args, http, base, mix, records, log)
            await wait_idle(http, base)
            start = await probes(http, base, served, records)
            log(f"soak: {args.minutes:g} min at {rate:g} req/s")
            t0, soak_recs = time.perf_counter_ns(), []

            def sink(rec: dict) -> None:
                records.append(rec)
                soak_recs.append(rec)

            sampler = Sampler(http, base, srv.pid, t0, args.sample_s, run_dir / "samples.csv", soak_recs)
            stop = asyncio.Event()
            sampling = asyncio.create_task(sampler.run(stop))
            res = await load.run_load(http, base, mix, rate, args.minutes * 60, sink, args.seed,
                                      period_s=period(args.minutes * 60, rate))
            stop.set()
            await sampling
            end = await wait_idle(http, base)  # the load has stopped: every block must be back
            end_probes = await probes(http, base, served, records)
            reset, memory, after = await closing_reads(http, base)
    finally:
        exit_code = srv.proc.poll() if srv.proc else None  # None: still running, as it should be
        await srv.stop()
    ctx.update(rate=rate, t0=t0, soak=soak_recs, rows=sampler.rows, blocks_end=end, probes=(start, end_probes),
               effective={k: eff.get(k) for k in ("max_model_len", "kv_blocks", "block_size", "prefix_caching",
                                                   "speculative", "num_threads", "engine_process")})
    died = "" if exit_code is None else f"**The server exited with code {exit_code} before the end.** "
    ctx["end_note"] = (f"{died}{res['sent']} requests sent in the soak, {res['unfinished']} still unfinished after "
                       f"the drain (cancelled). Once idle: {end.get('kv_blocks_used')} KV blocks in use; "
                       f"/reset_prefix_cache answered {reset} (200: no request held a block). KV peak "
                       f"{memory.get('kv_peak_used', 0) / 2**20:.1f} MiB of "
                       f"{memory.get('kv_allocated', 0) / 2**20:.0f} MiB; prefix-cache hit rate "
                       f"{_pct(after.get('prefix_hit_rate'))}, n-gram acceptance "
                       f"{_pct(after.get('spec_accept_rate'))}.")
    return ctx


def period(total_s: float, rate: float) -> float | None:
    """The load's period: one latency window (verdict.windows), so that every window holds the same
    arrivals; None (no repeat) when a window holds less than one deck of the mix (a CI-sized run)."""
    _, (a, b), _ = verdict.windows(total_s)
    return b - a if (b - a) * rate >= sum(DECK.values()) else None


async def closing_reads(http, base: str) -> tuple[int | None, dict, dict]:
    """/reset_prefix_cache's status (200 only when no request holds a block), /server_info's memory and a
    last scrape; None / {} from a server that no longer answers, so that the page is still written."""
    try:
        async with http.post(base + "/reset_prefix_cache") as resp:
            reset = resp.status
        return reset, (await get_json(http, base + "/server_info"))["memory"], await scrape(http, base)
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None, {}, {}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def report_path(out: Path, date: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    md, k = out / f"{date}-soak.md", 2
    while md.exists():  # a second run the same day keeps the first page
        md, k = out / f"{date}-soak-{k}.md", k + 1
    return md


def main(argv: list[str]) -> int:
    args = parse(argv)
    if not (Path(args.model) / "config.json").exists():
        print(f"soak: no model at {args.model} (make soak makes it: inferlab make-model {DEFAULT_MODEL} "
              "--preset smollm2-135m-instruct)", file=sys.stderr)
        return 2
    now = datetime.datetime.now(datetime.timezone.utc)
    run_dir = args.run_dir or REPO / "results/soak" / now.strftime("%Y%m%dT%H%M%SZ")
    run_dir.mkdir(parents=True, exist_ok=True)
    log, load_before = Log(run_dir / "soak.log"), " ".join(f"{x:.2f}" for x in os.getloadavg())
    try:
        ctx = asyncio.run(soak(args, run_dir, log))
    except ServerStartError as err:
        print(f"soak: the server did not start: {err}", file=sys.stderr)
        return 2
    with (run_dir / "requests.jsonl").open("w") as f:
        for r in ctx["records"]:
            f.write(json.dumps(r) + "\n")
    total_s = args.minutes * 60
    lines = verdict.verdicts(ctx["records"], ctx["soak"], ctx["rows"], ctx["t0"], total_s, ctx["blocks_end"],
                             ctx["probes"], args.mechanism)
    ctx.update(verdict_lines=verdict.format_lines(lines, args.mechanism), windows=verdict.windows(total_s),
               command=("make soak: " if os.environ.get("MAKELEVEL") else "") + "python "
               + shlex.join(["-m", "experiments.soak", *argv]), started=now.strftime("%F %H:%M UTC"),
               commit=(results.git_commit(REPO) or "?")[:12], hardware=results.hardware(), load_before=load_before,
               load_after=" ".join(f"{x:.2f}" for x in os.getloadavg()), run_dir=run_dir, minutes=args.minutes,
               model_name=Path(args.model).name, mechanism=args.mechanism, sample_s=args.sample_s)
    md = report_path(args.out, now.strftime("%F"))
    report.write(md, ctx)
    for line in ctx["verdict_lines"]:
        log(line)
    log(f"written to {md} (raw data: {run_dir})")
    return verdict.misses(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
