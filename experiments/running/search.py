"""`load.mode = "search"`: the best load an engine sustains under the config's SLOs.

The answer to "how much traffic can this engine take on this machine?" is one number per
engine: the highest Poisson rate at which at least `search.goodput` (default 95 %) of the
requests meet every SLO. Found per engine (and repeat) by bracketing, then bisection:

    rate = start_rate; double while the level passes (halve while it fails) until one
    passing and one failing rate bracket the answer; then test their midpoint and keep
    the half that contains the boundary; stop after `max_levels` levels.

The result is the highest passing rate, with the bracket's width as its precision (one
bisection step). A level lasts: it sends arrivals for at least `level_s` seconds (`level_size`),
fresh requests of the workload's kind past its own, because a short level at a high rate is a burst
that an engine with room for every request absorbs: 48 requests at 32 req/s passed on an engine
that sustains 8.5 (docs/perf/2026-12-05-simulate-6.md). Each level is a normal open-loop level (its own warm-up, the observer
off the measured path), so its requests and metrics land in the report like any other.
A resumed search starts over: its levels depend on the results before them.
"""
from __future__ import annotations

import math
from typing import Any, AsyncIterator

from experiments.measuring import metrics
from experiments.running.load import chains


def goodput_fraction(records: list[dict[str, Any]], sent: int, slo: dict[str, float | None]) -> float:
    """Share of the `sent` requests that finished and met every SLO."""
    if sent == 0:
        return 0.0
    return sum(metrics.meets_slo(metrics.per_request(r), slo) for r in records) / sent


def level_size(rate: float, base: int, level_s: float) -> int:
    """Requests (chains) a level at `rate` sends: the workload's `base`, or as many as arrive in
    `level_s` seconds when that is more."""
    return max(base, math.ceil(rate * level_s)) if math.isfinite(rate) else base


def every_request(cfg: Any) -> Any:
    """The config's workload grown to the most requests (chains) one level can send, the search's
    included (it can reach start_rate * 2^(max_levels - 1)): what the simulator's EOS lengths must cover."""
    w, load = cfg.workload, cfg.load
    if load.mode != "search":
        return w
    top = load.search.start_rate * 2 ** (load.search.max_levels - 1)
    return w.model_copy(update={"num_requests": level_size(top, w.num_requests, load.search.level_s)})


def sized(cfg: Any, items: list) -> list:
    """The items whose longest request sets the run's max_model_len (experiments/workload/context.py): the
    workload's, or with a search every request a level may send (a grown level's prompts can be longer)."""
    if cfg.load.mode != "search":
        return items
    from experiments.workload import workloads

    return workloads.build(cfg.model, every_request(cfg), 0)[0]


def next_rate(rate: float, passed: bool, lo: float | None, hi: float | None) -> tuple[float, float | None, float | None]:
    """(next rate, highest passing, lowest failing) after a level at `rate`."""
    if passed:
        lo = rate if lo is None else max(lo, rate)
    else:
        hi = rate if hi is None else min(hi, rate)
    if hi is None:
        return rate * 2, lo, hi
    if lo is None:
        return rate / 2, lo, hi
    return (lo + hi) / 2, lo, hi


async def levels(er: Any, engine: Any, info: Any, sampler: Any) -> AsyncIterator[str | None]:
    """Run the search's levels through `er._level` (an EngineRun); yields each level's failure."""
    cfg = er.plan.cfg
    sc, slo = cfg.load.search, cfg.slo.model_dump()
    rate, lo, hi = sc.start_rate, None, None
    points: list[dict[str, Any]] = []
    er.rep["search"] = {"points": points, "target": sc.goodput, "best_rate": None, "failing_rate": None,
                        "level_s": sc.level_s}
    er.done = {}  # a search never resumes half-way: the rates it picks depend on what came before
    base = len(chains(er.plan.items))
    for _ in range(sc.max_levels):
        try:
            items = er.plan.items_for(level_size(rate, base, sc.level_s))
        except ValueError as e:  # a ShareGPT file with fewer usable conversations than the level needs
            yield f"search level at {rate:g} req/s for {sc.level_s:g} s: {e} (lower load.search.level_s)"
            return
        failure = await er._level(engine, info, sampler, "rate", rate, items)
        yield failure
        if failure:
            return
        frac = goodput_fraction(er.last_records, len(items), slo)
        passed = frac >= sc.goodput
        points.append({"rate": rate, "level": f"rate={rate:g}", "requests": len(items), "goodput_fraction": frac,
                       "passed": passed})
        rate, lo, hi = next_rate(rate, passed, lo, hi)
        er.rep["search"].update(best_rate=lo, failing_rate=hi)
