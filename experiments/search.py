"""`load.mode = "search"`: the best load an engine sustains under the config's SLOs.

The answer to "how much traffic can this engine take on this machine?" is one number per
engine: the highest Poisson rate at which at least `search.goodput` (default 95 %) of the
requests meet every SLO. Found per engine (and repeat) by bracketing, then bisection:

    rate = start_rate; double while the level passes (halve while it fails) until one
    passing and one failing rate bracket the answer; then test their midpoint and keep
    the half that contains the boundary; stop after `max_levels` levels.

The result is the highest passing rate, with the bracket's width as its precision (one
bisection step). Each level is a normal open-loop level (its own warm-up, the observer
off the measured path), so its requests and metrics land in the report like any other.
A resumed search starts over: its levels depend on the results before them.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

from experiments import metrics


def goodput_fraction(records: list[dict[str, Any]], sent: int, slo: dict[str, float | None]) -> float:
    """Share of the `sent` requests that finished and met every SLO."""
    if sent == 0:
        return 0.0
    return sum(metrics.meets_slo(metrics.per_request(r), slo) for r in records) / sent


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
    er.rep["search"] = {"points": points, "target": sc.goodput, "best_rate": None, "failing_rate": None}
    er.done = {}  # a search never resumes half-way: the rates it picks depend on what came before
    for _ in range(sc.max_levels):
        failure = await er._level(engine, info, sampler, "rate", rate)
        yield failure
        if failure:
            return
        frac = goodput_fraction(er.last_records, len(er.plan.items), slo)
        passed = frac >= sc.goodput
        points.append({"rate": rate, "level": f"rate={rate:g}", "goodput_fraction": frac, "passed": passed})
        rate, lo, hi = next_rate(rate, passed, lo, hi)
        er.rep["search"].update(best_rate=lo, failing_rate=hi)
