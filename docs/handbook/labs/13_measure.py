"""Lab 13 — measuring inference: one variable at a time, with the harness's own pieces, on a real model.

Smallest working piece: the harness's load generator (`experiments/load.py`) sends token-exact prompts
(`experiments/workloads.py`) to an engine through the `Engine` interface, stamps every event on arrival,
and `experiments/metrics.py` turns the records into TTFT, TPOT, E2EL and throughput exactly as in a
report; `experiments/intervals.py` gives each median a 95 % interval (a bootstrap over requests). We
sweep prompt length, then output length, then concurrency, holding the other two fixed, and say from
the intervals which metric moved: a sentence is printed only where the intervals at the two ends do not
overlap, "inconclusive on this machine" where they do.

The engine runs in a process of its own (`experiments/isolate.py`, as in every report's latency run),
so this client never holds its interpreter lock; `--same-process` runs it in this one instead, to see
the observer effect. The default run is CI-sized (a few requests per point, SmolLM2-135M-Instruct on
the CPU); `--full` is the run whose numbers chapter 13 records.

    python docs/handbook/labs/13_measure.py [--model DIR] [--full] [--same-process]
"""
import argparse
import asyncio
from pathlib import Path

import numpy as np

from adapters import registry
from experiments.config import Workload
from experiments.intervals import overlap, request_ci
from experiments.isolate import Isolated
from experiments.load import LoadGenerator, chains
from experiments.metrics import summarize
from experiments.results import record
from experiments.workloads import load_tokenizer, random_items
from reference_engine.trace import resolve_real_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/smollm2-135m-instruct, made if absent)")
ap.add_argument("--full", action="store_true", help="more requests and wider sweeps (minutes, not seconds)")
ap.add_argument("--same-process", action="store_true", help="the engine in this process (measures the observer too)")
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
    from experiments.metrics import per_request
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


async def main():
    options = {"mode": "in_process", "kv_cache_tokens": 8192}
    engine = (registry.get("reference")(model, "float32", options) if args.same_process else
              Isolated(registry.ADAPTERS["reference"], model, "float32", options))
    info = await engine.start()
    tok = load_tokenizer(model)
    print(f"engine {info.engine} {info.version}, model {model}, {N} requests per point (x concurrency), greedy, "
          f"fixed output length; engine " + ("in this process" if args.same_process else f"in its own process (pid {info.pid})"))
    await level(engine, tok, 16, 2, 1, seed=99)  # warm-up, not measured
    print(f"{'sweep':<15}{'value':>7}{'TTFT ms [95% CI]':>24}{'TPOT ms [95% CI]':>22}{'E2EL ms':>10}{'tok/s':>8}")
    verdicts = []
    for var, (values, prompt, output, conc) in SWEEPS.items():
        rows = []
        for i, v in enumerate(values):
            p, o, c = (v if prompt is None else prompt), (v if output is None else output), (v if conc is None else conc)
            r = await level(engine, tok, p, o, c, seed=i)
            rows.append(r)
            ci = {k: (f"[{r['ci'][k][0]:.1f}-{r['ci'][k][1]:.1f}]" if r["ci"][k] else "") for k in METRICS}
            tpot = f"{r['median']['tpot_ms']:.2f} {ci['tpot_ms']}" if r["median"]["tpot_ms"] else "-"
            print(f"{var:<15}{v:>7}{r['median']['ttft_ms']:>10.1f} {ci['ttft_ms']:<13}{tpot:>22}"
                  f"{r['median']['e2el_ms']:>10.1f}{r['tok/s']:>8.1f}")
        verdicts.append(verdict(var, values[0], values[-1], rows[0], rows[-1]))
    await engine.stop()
    print("\n".join(verdicts))


asyncio.run(main())
