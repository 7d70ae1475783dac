"""`inferlab simulate CONFIG --capacity --slo ...`: how much Poisson traffic N replicas take under an SLO,
and how many replicas a target rate needs.

Two pass rules. With `--slo`, percentiles of per-request latency (`ttft_p99_ms=1000,tpot_p99_ms=100`: metric
ttft, tpot or e2el; statistic p50, p90, p99 or mean): a rate passes when every limit holds over the level's
requests. Without it, the measured search's own rule (`inferlab run` with load.mode = "search",
experiments/running/search.py): the config's `[slo]` limits per request, and a rate passes when at least
`load.search.goodput` (default 0.95) of the requests sent meet every one (`GoodputRule`), so a simulated
capacity and a measured one are judged alike. The search is the harness's (experiments/running/search.py `next_rate`: double until a level fails,
then bisect), at most `LEVELS` levels, starting from the rate one replica sustains with one request
at a time. Each level replays `n` requests (the workload's prompts cycled, each with its EOS length
where given, each cycle's copies made new to the prefix cache: `copy_prompt`) arriving as a seeded
Poisson process, through the fleet loop (fleet.py).

Invariant: the capacity is the highest rate that passed; the first failing rate is reported beside it
(the answer lies between them).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from experiments.measuring import metrics
from experiments.running import load, search
from experiments.simulate import fleet
from reference_engine.engine import router
from experiments.simulate.replay import replica_for
from experiments.simulate.step_model import Profile
from experiments.workload import context, workloads

LEVELS = 12


class GoodputRule(dict):
    """The measured search's pass rule: per-request limits ({"ttft_ms": ...}) and the share that must meet them."""

    def __init__(self, limits: dict[str, float], goodput: float):
        super().__init__({k: v for k, v in limits.items() if v is not None})
        self.goodput = goodput


def config_rule(cfg) -> GoodputRule:
    """The config's `[slo]` and search goodput as a rule (ValueError without an SLO)."""
    limits = cfg.slo.model_dump() if cfg.slo is not None else {}
    if not any(v is not None for v in limits.values()):
        raise ValueError("--capacity needs --slo or an [slo] in the config, e.g. --slo ttft_p99_ms=1000,tpot_p99_ms=100")
    search_cfg = getattr(cfg.load, "search", None)
    return GoodputRule(limits, search_cfg.goodput if search_cfg is not None else 0.95)
SLO_KEY = re.compile(r"^(ttft|tpot|e2el)_(p50|p90|p99|mean)_ms$")


def parse_slo(text: str) -> dict[tuple[str, str], float]:
    """"ttft_p99_ms=1000,tpot_p99_ms=100" -> {("ttft", "p99"): 1000.0, ("tpot", "p99"): 100.0}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, val = part.partition("=")
        m = SLO_KEY.match(key.strip())
        try:
            limit = float(val)
        except ValueError:
            limit = -1.0
        if not m or not limit > 0:
            raise ValueError(f"--slo {part!r}: expected METRIC_STAT_ms=LIMIT with METRIC ttft, tpot or e2el, "
                             f"STAT p50, p90, p99 or mean, LIMIT > 0 (e.g. ttft_p99_ms=1000)")
        out[(m.group(1), m.group(2))] = limit
    if not out:
        raise ValueError("--slo is empty: e.g. ttft_p99_ms=1000,tpot_p99_ms=100")
    return out


def latencies(done: list[fleet.Done]) -> dict[str, np.ndarray]:
    """Per-request TTFT, TPOT and E2EL in ms, as experiments/measuring/metrics.py defines them."""
    ok = [d for d in done if d.first is not None]
    ttft = np.array([(d.first - d.send) * 1e3 for d in ok])
    e2el = np.array([(d.last - d.send) * 1e3 for d in ok])
    tpot = np.array([(d.last - d.first) * 1e3 / (d.tokens - 1) for d in ok if d.tokens >= 2])
    return {"ttft": ttft, "tpot": tpot, "e2el": e2el}


def rows(done: list[fleet.Done]) -> list[dict[str, float]]:
    """Per finished request, the metrics' row keys `metrics.meets_slo` reads (TPOT NaN for one token)."""
    return [{"ttft_ms": (d.first - d.send) * 1e3, "e2el_ms": (d.last - d.send) * 1e3,
             "tpot_ms": (d.last - d.first) * 1e3 / (d.tokens - 1) if d.tokens >= 2 else math.nan}
            for d in done if d.first is not None]


def stat(a: np.ndarray, s: str) -> float:
    if a.size == 0:
        return math.nan
    return float(a.mean()) if s == "mean" else float(np.percentile(a, float(s[1:])))


def copy_prompt(prompt: list[int], cycle: int) -> list[int]:
    """Cycle `cycle`'s copy of a workload prompt: the same length, its first token replaced by -1 - cycle
    (no real token: the simulator runs no model, and ids only key the prefix cache) from the second
    cycle on. A copy is a new request, not a cache hit on its earlier copies; within one cycle the
    prompts share prefixes exactly as the workload's own requests do."""
    return prompt if cycle == 0 or not prompt else [-1 - cycle, *prompt[1:]]


def level(cfg, make_fleet, items, lengths, rate: float, n: int, slo) -> dict[str, Any]:
    """One Poisson level at `rate` over n requests: the SLO's statistics, pass/fail, replica stats."""
    offs = load.arrivals(n, rate, cfg.load.burstiness, cfg.load.seed)
    arr = []
    for j, t in enumerate(offs):
        it = items[j % len(items)]
        out = None if cfg.sampling.ignore_eos else (lengths or {}).get(it.request_id)
        arr.append(fleet.Arrival(t, f"{it.request_id}#{j}", copy_prompt(it.prompt_token_ids, j // len(items)),
                                 it.output_len, out))
    f = make_fleet()
    done, wall = f.run(arr)
    if isinstance(slo, GoodputRule):
        good = sum(metrics.meets_slo(row, slo) for row in rows(done))
        got = {"goodput_fraction": good / n}
        passed = got["goodput_fraction"] >= slo.goodput
    else:
        lat = latencies(done)
        got = {f"{m}_{s}_ms": stat(lat[m], s) for m, s in slo}
        passed = all(got[f"{m}_{s}_ms"] <= lim for (m, s), lim in slo.items())
    toks = sum(d.tokens for d in done)
    return {"rate": rate, "passed": passed, **got, "output_tok_s": toks / wall if wall else None,
            "replicas": [s.summary(wall) for s in f.stats]}


def search_rate(cfg, make_fleet, items, lengths, slo, n: int, start: float) -> dict[str, Any]:
    points, rate, lo, hi = [], start, None, None
    for _ in range(LEVELS):
        p = level(cfg, make_fleet, items, lengths, rate, n, slo)
        points.append(p)
        rate, lo, hi = search.next_rate(rate, p["passed"], lo, hi)
        if lo is not None and hi is not None and (hi - lo) / hi < 0.02:
            break
    best = max((p for p in points if p["passed"]), key=lambda p: p["rate"], default=None)
    return {"best_rate": lo, "failing_rate": hi, "points": points, "best": best}


def run(cfg, engine: str, profile: Profile, slo, replicas: int, router_name: str, lengths, n: int | None,
        target: float | None, out: Path, accept: float = 0.7, settings=None) -> str:
    """The search (and, with `target`, the replicas it needs); writes capacity.json, returns the summary."""
    items, warm = workloads.build(cfg.model, cfg.workload, cfg.load.warmup)
    mml = context.choose(cfg, items + warm, workloads.context_len(cfg.model))
    n = n or max(2000, len(items))

    def factory(k: int):
        def make():
            reps = [replica_for(cfg, engine, profile, mml, accept, settings, seed=i) for i in range(k)]
            return fleet.Fleet(reps, router.make(router_name, k, reps[0].cfg.block_size))
        return make

    one = factory(1)()
    alone = max(1e-6, _alone_s(one, items, lengths, cfg))
    res = search_rate(cfg, factory(replicas), items, lengths, slo, n, start=replicas / alone)
    need = None
    if target and res["best_rate"]:
        k = max(1, math.ceil(target / (res["best_rate"] / replicas)))
        while k < 4 * math.ceil(target / (res["best_rate"] / replicas)) + 4:  # verify: routing may cost some
            if level(cfg, factory(k), items, lengths, target, n, slo)["passed"]:
                need = k
                break
            k += 1
    doc = {"config": cfg.name, "engine": engine, "profile": profile.label, "calibrated": profile.calibrated,
           "slo": dict(slo) if isinstance(slo, GoodputRule) else {f"{m}_{s}_ms": v for (m, s), v in slo.items()},
           "goodput": slo.goodput if isinstance(slo, GoodputRule) else None, "replicas": replicas, "router": router_name,
           "requests_per_level": n, **res, "target_rate": target, "replicas_needed": need}
    path = out / f"{cfg.name}-capacity" / f"capacity-{replicas}x-{router_name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))
    return render(doc) + f"\n(written to {path})"


def _alone_s(f: fleet.Fleet, items, lengths, cfg) -> float:
    """Seconds one replica spends on the workload's first request alone (the search's first guess)."""
    it = items[0]
    out = None if cfg.sampling.ignore_eos else (lengths or {}).get(it.request_id)
    done, wall = f.run([fleet.Arrival(0.0, it.request_id, it.prompt_token_ids, it.output_len, out)])
    return wall


def render(doc: dict[str, Any]) -> str:
    tag = "" if doc["calibrated"] else " -- UNCALIBRATED: spec-sheet profile"
    lines = [f"capacity of {doc['engine']} ({doc['config']}), profile {doc['profile']}{tag}",
             f"SLO {', '.join(f'{k}<={v:g}' for k, v in doc['slo'].items())}; {doc['replicas']} replica(s), "
             f"router {doc['router']}, {doc['requests_per_level']} requests per level (simulated)"]
    if doc.get("goodput") is not None:
        lines[-1] += f"; a rate passes when >= {doc['goodput']:.0%} of requests meet every limit (the measured search's rule)"
    for p in doc["points"]:
        keys = ["goodput_fraction"] if doc.get("goodput") is not None else list(doc["slo"])
        stats = ", ".join(f"{k}={p[k]:.3f}" if k == "goodput_fraction" else f"{k}={p[k]:.1f}" for k in keys)
        lines.append(f"  rate {p['rate']:9.3f} req/s  {'pass' if p['passed'] else 'FAIL'}  {stats}")
    b = doc["best_rate"]
    lines.append(f"capacity: {b:.3f} req/s in all, {b / doc['replicas']:.3f} per replica (first failing rate "
                 f"{doc['failing_rate']})" if b else "capacity: no rate passed")
    if doc.get("best"):
        for i, r in enumerate(doc["best"]["replicas"]):
            lines.append(f"  replica {i}: {r['requests']} requests, stepping {r['busy']:.0%} of the time, "
                         f"KV peak {r['kv_peak']:.0%} mean {r['kv_mean']:.0%}, {r['preemptions']} preemptions, prefix hits "
                         f"{r['prefix_hit_rate']:.0%}")
    if doc.get("target_rate"):
        lines.append(f"replicas needed for {doc['target_rate']:g} req/s: {doc['replicas_needed'] or 'not found'}")
    return "\n".join(lines)
