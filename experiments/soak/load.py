"""Open-loop Poisson arrivals of the soak's mix, and the SLO search over the same mix.

The soak replays one period of arrivals (the length of a latency window, verdict.windows) again and
again: any window of that length then holds exactly the same arrivals, so the drift verdict compares
the server with itself, not one random draw of Poisson arrivals with another. (With fresh draws, a
5-minute window at 1.5 req/s held 424 to 473 requests and 59k to 67k prompt tokens, and the p99 of
its TTFT went 1.7 to 3.3 s across five windows of one run with no trend: docs/perf/2026-12-04-soak-3.md.)

The search is the harness's (`experiments.running.search`): the same bracketing and bisection (`next_rate`)
and the same goodput rule (`goodput_fraction`: the share of the requests sent that finished within
every SLO, TTFT and TPOT computed by `experiments.measuring.metrics`). Only the traffic differs: each level is
`level_s` seconds of the soak's own mix, and it judges the interactive kinds (chat and multi-turn);
long prompts, cut streams and the rest load the server at the same time but carry no SLO (a prompt
filling the context cannot answer as fast as a question, and a cut stream never finishes).
"""
from __future__ import annotations

import asyncio
import math
import time
from typing import Callable

import aiohttp
import numpy as np

from experiments.running import search
from experiments.soak import client
from experiments.soak.mix import INTERACTIVE, Mix, Req, Slot, plan
from experiments.soak.observe import wait_idle


async def _one(http: aiohttp.ClientSession, base: str, req: Req, mix: Mix, sink: Callable[[dict], None]) -> None:
    rec = await client.send(http, base, req)
    ok = rec["status"] == 200 and rec["done"] and not rec["error"]
    mix.done(req, rec["text"] if ok else None)
    sink(rec)


def timeline(rate: float, duration_s: float, period_s: float, seed: int) -> list[tuple[float, Slot]]:
    """(send time, slot) of every arrival: one period of seeded Poisson arrivals (exponential gaps) and
    their slots (`mix.plan`), repeated every `period_s` until `duration_s`. Any `period_s` window then
    holds the same slots, whatever its start."""
    rng, offsets, at = np.random.default_rng(seed), [], 0.0
    while (at := at + rng.exponential(1.0 / rate)) < period_s:
        offsets.append(at)
    slots = plan(len(offsets), seed)
    return [(k * period_s + off, slot) for k in range(math.ceil(duration_s / period_s))
            for off, slot in zip(offsets, slots) if k * period_s + off < duration_s]


async def run_load(http: aiohttp.ClientSession, base: str, mix: Mix, rate: float, duration_s: float,
                   sink: Callable[[dict], None], seed: int, period_s: float | None = None,
                   drain_s: float = 300.0) -> dict:
    """The `timeline`'s arrivals (one period: `period_s`, default the whole run) for `duration_s`, then
    wait up to `drain_s` for the requests still in flight (those left are cancelled and counted as
    `unfinished`). Each period sends the same kinds and shapes at the same offsets, with fresh text."""
    tasks, sent, t0 = set(), 0, time.perf_counter()
    for at, slot in timeline(rate, duration_s, period_s or duration_s, seed):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(_one(http, base, mix.make(slot), mix, sink))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
    await asyncio.sleep(max(0.0, t0 + duration_s - time.perf_counter()))
    pending = set()
    if tasks:
        _, pending = await asyncio.wait(set(tasks), timeout=drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return {"sent": sent, "unfinished": len(pending), "wall_s": time.perf_counter() - t0}


async def search_rate(http: aiohttp.ClientSession, base: str, mix: Mix, slo: dict, start_rate: float,
                      max_levels: int, level_s: float, goodput: float, sink: Callable[[dict], None],
                      log: Callable[[str], None]) -> dict:
    """{"points": [...], "best_rate": highest passing or None, "failing_rate": lowest failing or None}."""
    rate, lo, hi, points = start_rate, None, None, []
    for level in range(max_levels):
        recs: list[dict] = []

        def keep(rec: dict) -> None:
            recs.append(rec)
            sink(rec)

        await run_load(http, base, mix, rate, level_s, keep, seed=10_000 + level)
        await wait_idle(http, base)  # the next level starts on an idle server
        inter = [r for r in recs if r["kind"] in INTERACTIVE]
        ok = [r for r in inter if r["status"] == 200 and r["done"] and not r["error"]]
        frac = search.goodput_fraction(ok, len(inter), slo)
        passed = bool(inter) and frac >= goodput
        points.append({"rate": rate, "requests": len(recs), "judged": len(inter), "goodput_fraction": frac,
                       "passed": passed})
        log(f"search level {level + 1}/{max_levels}: {rate:g} req/s, {frac:.0%} of {len(inter)} interactive "
            f"requests within the SLO -> {'pass' if passed else 'fail'}")
        rate, lo, hi = search.next_rate(rate, passed, lo, hi)
    return {"points": points, "best_rate": lo, "failing_rate": hi, "slo": slo, "goodput": goodput,
            "level_s": level_s}
