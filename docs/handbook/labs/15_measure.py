"""Lab 15 — measuring inference: one variable at a time, with the harness's own pieces, on a real model.

Smallest working piece: the harness's load generator (`experiments/running/load.py`) sends token-exact prompts
(`experiments/workload/workloads.py`) to an engine through the `Engine` interface, stamps every event on arrival,
and `experiments/measuring/metrics.py` turns the records into TTFT, TPOT, E2EL and throughput exactly as in a
report; `experiments/measuring/intervals.py` gives each median a 95 % interval (a bootstrap over requests). We
sweep prompt length, then output length, then concurrency, holding the other two fixed, and say from
the intervals which metric moved: a sentence is printed only where the intervals at the two ends do not
overlap, "inconclusive on this machine" where they do.

The engine runs in a process of its own (`experiments/running/isolate.py`, as in every report's latency run),
so this client never holds its interpreter lock; `--same-process` runs it in this one instead, to see
the observer effect. The default run is CI-sized (a few requests per point, SmolLM2-135M-Instruct on
the CPU); `--full` is the run whose numbers chapter 15 records, written by `--out FILE` as markdown
(docs/handbook/build_tables.py pulls its table into the chapter; the tests read its verdicts).

Why the prompt sweep's TTFT grows as it does: the lab counts one prefill's FLOPs at both ends (the
matmuls, and causal attention, which grows with the square of the prompt), then times one prefill at
each end in this process with the attention backend's calls timed apart, and says which of the two
(FLOPs, or the measured prefill times) the served TTFT ratio agrees with, or that neither does.

    python docs/handbook/labs/15_measure.py [--model DIR] [--full] [--same-process] [--out FILE]
"""
import argparse
import asyncio
import datetime
import os
import subprocess
import time
from pathlib import Path

import numpy as np

from adapters import registry
from experiments.measuring.intervals import overlap, request_ci
from experiments.measuring.metrics import summarize
from experiments.running.isolate import Isolated
from experiments.running.load import LoadGenerator, chains
from experiments.running.results import record
from experiments.workload.config import Workload
from experiments.workload.workloads import load_tokenizer, random_items
from reference_engine.config import ModelConfig
from reference_engine.engine.trace import resolve_real_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/smollm2-135m-instruct, made if absent)")
ap.add_argument("--full", action="store_true", help="more requests and wider sweeps (minutes, not seconds)")
ap.add_argument("--same-process", action="store_true", help="the engine in this process (measures the observer too)")
ap.add_argument("--out", help="also write the run as markdown to FILE (the chapter's record of --full)")
args = ap.parse_args()
model = str(Path(resolve_real_model(args.model)).resolve())
N = 8 if args.full else 3  # requests per point
SWEEPS = {  # variable -> (values, fixed prompt, output, concurrency); one variable moves at a time
    "prompt tokens": ([16, 256, 1024] if args.full else [16, 192], None, 4 if args.full else 2, 1),
    "output tokens": ([4, 32, 128] if args.full else [2, 12], 32 if args.full else 16, None, 1),
    "concurrency": ([1, 2, 4, 8] if args.full else [1, 4], 32 if args.full else 16, 8 if args.full else 4, None),
}
METRICS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2el_ms": "E2EL"}


def per_request_ms(records, key):
    """One array per request (what request_ci resamples), from the same per-request rows as the report."""
    from experiments.measuring.metrics import per_request
    return [np.array([v]) if v == v else np.array([]) for v in (per_request(r)[key] for r in records)]


async def level(engine, tok, prompt, output, conc, seed):
    items = random_items(tok, Workload(input_len=prompt, output_len=output), N * (conc if conc > 1 else 1), seed)
    outs = []
    gen = LoadGenerator(engine, {"temperature": 0.0, "ignore_eos": True}, outs.append)
    await gen.closed(chains(items), conc)
    assert gen.failure is None, gen.failure
    recs = [record(o, "lab", 0) for o in outs]
    s = summarize(recs)
    row = {"median": {k: s[k]["median"] for k in METRICS}, "tok/s": s["output_throughput"]}
    row["ci"] = {k: request_ci(per_request_ms(recs, k), np.median) for k in METRICS}
    return row


def verdict(var, lo_val, hi_val, lo, hi):
    """Which metrics moved between the two ends of a sweep, judged by the intervals only."""
    moved, flat = [], []
    for k, name in METRICS.items():
        a, b = lo["ci"][k], hi["ci"][k]
        if a is None or b is None:
            continue
        if overlap(a, b):
            flat.append(name)
        else:
            moved.append(f"{name} {hi['median'][k] / lo['median'][k]:.1f}x")
    said = f"{var} {lo_val} -> {hi_val}: "
    said += ("moved (intervals apart): " + ", ".join(moved)) if moved else "nothing moved beyond its interval"
    if flat:
        said += "; inconclusive on this machine (intervals overlap): " + ", ".join(flat)
    return said + f"; output tok/s {lo['tok/s']:.1f} -> {hi['tok/s']:.1f} (one value per run: no interval)"


def ratio_range(lo: dict, hi: dict, key: str = "ttft_ms") -> tuple[float, float] | None:
    """The range a ratio hi / lo can take inside the two intervals: [hi low / lo high, hi high / lo low]."""
    a, b = lo["ci"][key], hi["ci"][key]
    return None if a is None or b is None else (b[0] / a[1], b[1] / a[0])


def prefill_flops(mc, n: int) -> tuple[float, float]:
    """(matmul FLOPs, attention FLOPs) of one n-token prefill: 2 per weight per token in the layers' linears,
    plus the LM head for the one row that samples; causal attention does q.k and p.v for each of the
    n (n + 1) / 2 (query, key) pairs, 2 FLOPs per multiply-add over heads x head_dim, twice."""
    d, h = mc.head_dim, mc.hidden_size
    per_layer = h * (mc.num_heads + 2 * mc.num_kv_heads) * d + mc.num_heads * d * h + 3 * h * mc.intermediate_size
    matmul = 2 * (mc.num_layers * per_layer * n + h * mc.vocab_size)
    attention = 2 * 2 * mc.num_layers * mc.num_heads * d * n * (n + 1) / 2
    return matmul, attention


def explain(lo_n: int, hi_n: int, flops: dict, timed: dict, measured: float, rng) -> str:
    """Which account of the TTFT ratio the served measurement agrees with, from the numbers alone:
    the FLOPs' ratio, the ratio of this process's prefill times, or neither (then: unexplained here)."""
    by_flops = sum(flops[hi_n]) / sum(flops[lo_n])
    by_time = (timed[hi_n][0] / timed[lo_n][2], timed[hi_n][2] / timed[lo_n][0])  # fastest and slowest repeats
    said = (f"TTFT x{measured:.1f} measured (the ratio's range inside the intervals x{rng[0]:.1f}-x{rng[1]:.1f}); "
            f"FLOPs predict x{by_flops:.1f}, this process's prefill times x{by_time[0]:.1f}-x{by_time[1]:.1f}: ")
    if rng[0] <= by_flops <= rng[1]:
        return said + "the FLOPs explain the growth"
    if by_time[0] <= rng[1] and rng[0] <= by_time[1]:  # the two ranges overlap
        m_rate = [(flops[n][0]) / (timed[n][0] - timed[n][1]) / 1e9 for n in (lo_n, hi_n)]
        a_rate = flops[hi_n][1] / timed[hi_n][1] / 1e9
        return said + (f"the FLOPs do not, the prefill times do: at {hi_n} tokens attention ran at {a_rate:.0f} GFLOP/s "
                       f"and everything else at {m_rate[1]:.0f} (at {lo_n} tokens: {m_rate[0]:.0f})")
    return said + ("unexplained on this machine: neither falls inside the measured range (the served TTFTs and "
                   "these prefills ran at different moments of a shared machine)")


async def timed_prefills(model: str, lengths: list[int], repeats: int = 3) -> dict[int, tuple[float, float]]:
    """n -> (fastest prefill seconds, its attention-backend seconds, slowest prefill seconds), one n-token prompt
    at a time, in this process."""
    from reference_engine.config import EngineConfig
    from reference_engine.engine.llm_engine import LLMEngine
    from reference_engine.sampling_params import SamplingParams

    eng = LLMEngine(EngineConfig(model=model, kv_cache_tokens=4096, enable_prefix_caching=False))
    backend, spent = eng.runner.backend, [0.0]
    inner = backend.forward

    def forward(*a, **k):
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t0
    backend.forward = forward
    out = {}
    for n in [lengths[0]] + lengths:  # the first is a warm-up
        runs = []
        for r in range(repeats):
            spent[0] = 0.0
            eng.add_request([1000 + (7 * i + r) % 30000 for i in range(n)],
                            SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
            t0 = time.perf_counter()
            while eng.has_unfinished():
                eng.step()
            runs.append((time.perf_counter() - t0, spent[0]))
        out[n] = (*min(runs), max(runs)[0])
    return out


async def main():
    options = {"mode": "in_process", "kv_cache_tokens": 8192}
    engine = registry.create("reference", model, "float32", options)
    if not args.same_process:  # the same adapter class, built again in a child process of its own
        engine = Isolated(registry.target(engine), model, "float32", options)
    info = await engine.start()
    tok = load_tokenizer(model)
    print(f"engine {info.engine} {info.version}, model {model}, {N} requests per point (x concurrency), greedy, "
          f"fixed output length; engine " + ("in this process" if args.same_process else f"in its own process (pid {info.pid})"))
    await level(engine, tok, 16, 2, 1, seed=99)  # warm-up, not measured
    table = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    print("\n".join(table))
    verdicts, ends = [], {}
    for var, (values, prompt, output, conc) in SWEEPS.items():
        rows = []
        for i, v in enumerate(values):
            p, o, c = (v if prompt is None else prompt), (v if output is None else output), (v if conc is None else conc)
            r = await level(engine, tok, p, o, c, seed=i)
            rows.append(r)
            ci = {k: (f" [{r['ci'][k][0]:.1f}-{r['ci'][k][1]:.1f}]" if r["ci"][k] else "") for k in METRICS}
            tpot = f"{r['median']['tpot_ms']:.2f}{ci['tpot_ms']}" if r["median"]["tpot_ms"] else "-"
            table.append(f"| {var} | {v} | {r['median']['ttft_ms']:.1f}{ci['ttft_ms']} | {tpot} | "
                         f"{r['median']['e2el_ms']:.1f} | {r['tok/s']:.1f} |")
            print(table[-1])
        verdicts.append(verdict(var, values[0], values[-1], rows[0], rows[-1]))
        ends[var] = (values[0], values[-1], rows[0], rows[-1])
    await engine.stop()
    print("\n".join(verdicts))

    # Why TTFT grew along the prompt sweep: FLOPs, then this process's own prefill times.
    lo_n, hi_n, lo, hi = ends["prompt tokens"]
    mc = ModelConfig.from_dir(model)
    flops = {n: prefill_flops(mc, n) for n in (lo_n, hi_n)}
    timed = await timed_prefills(model, [lo_n, hi_n])
    lines = [f"one prefill's FLOPs ({mc.num_layers} layers, {mc.num_heads} heads of {mc.head_dim}): "
             + "; ".join(f"{n} tokens: matmuls {flops[n][0] / 1e9:.2f} GFLOP, causal attention {flops[n][1] / 1e9:.2f} "
                         f"GFLOP (+{flops[n][1] / flops[n][0]:.1%} over the matmuls)" for n in (lo_n, hi_n)),
             "one prefill timed in this process, 3 times: " + "; ".join(
                 f"{n} tokens {timed[n][0] * 1e3:.1f} ms at fastest (of which the attention backend "
                 f"{timed[n][1] * 1e3:.1f} ms), {timed[n][2] * 1e3:.1f} ms at slowest" for n in (lo_n, hi_n))]
    rng = ratio_range(lo, hi)
    lines.append(f"prompt tokens {lo_n} -> {hi_n}: " + explain(lo_n, hi_n, flops, timed,
                                                              hi["median"]["ttft_ms"] / lo["median"]["ttft_ms"], rng))
    print("\n".join(lines))
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        Path(args.out).write_text(
            f"# The measuring lab's {'full' if args.full else 'CI-sized'} sweep, {when}\n\n"
            f"Written by `python docs/handbook/labs/15_measure.py{' --full' if args.full else ''} --out {args.out}` "
            f"(git {commit or 'unknown'}); model {Path(model).name}, {N} requests per point (x concurrency), greedy, "
            f"fixed output length, the engine {'in the client' if args.same_process else 'in its own'} process. "
            f"One run, no repeats: the intervals are over the requests of this run. Load average (1 min) on "
            f"{os.cpu_count()} cores: {LOAD[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.\n\n"
            f"## Sweep\n\n" + "\n".join(table) + "\n\n## Verdicts\n\n```text\n" + "\n".join(verdicts + lines)
            + "\n```\n")
        print(f"written to {args.out}")


LOAD = os.getloadavg()  # the machine's load as the run starts (the record states it)
HEADER = "| sweep | value | TTFT ms [95% CI] | TPOT ms [95% CI] | E2EL ms | tok/s |"
asyncio.run(main())
