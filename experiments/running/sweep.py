"""`load.mode = "sweep"`: the levels a frontier needs, found by the sweep itself (config: `Sweep`).

Closed loop from `start` concurrent users, doubling. Every level is sustained: its users send fresh
requests (never one an earlier level sent, so no level rides on another's prefix cache) until
`level_s` seconds have passed, each after its own warm-up. After each level, `stop_reason` decides
from that level and the one before it; then `refine` adds levels at geometric midpoints where the
curve moved most. The engine's own counters speak first: preemption, or a queue holding more than
`max_queue_share` of its request time, means it is past what it can hold at once.

A level whose client sent late (its requests' send time against their due time, p99) is client-bound:
the load generator, not the engine, may have set its pace. It is flagged, and a sweep that stops on
one says so in its reason.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, AsyncIterator

from experiments.measuring import metrics, saturation
from experiments.running.load import chains


@dataclass
class Point:
    """What the stop rule reads of one measured level."""

    concurrency: int
    throughput: float | None  # output tok/s
    tpot_p50: float | None  # ms
    ttft_p99: float | None  # ms
    preemptions: float | None = None  # the engine's own counter over the level (None: it exports none)
    queue_share: float | None = None  # the engine's queue time over its request time (None: not exported)
    lateness_p99: float | None = None  # ms, the client's
    client_bound: bool = False


def stop_reason(points: list[Point], rule: Any) -> str | None:
    """Why the sweep stops after its last level (None: it doubles again). `rule` is the config's `Sweep`."""
    last = points[-1]
    why = None
    if last.preemptions:
        why = f"the engine preempted {last.preemptions:g} requests at concurrency {last.concurrency} (its own counter)"
    elif last.queue_share is not None and last.queue_share > rule.max_queue_share:
        why = (f"the engine's own queue held {last.queue_share:.0%} of its request time at concurrency "
               f"{last.concurrency} (more than {rule.max_queue_share:.0%})")
    elif rule.max_ttft_p99_ms is not None and last.ttft_p99 is not None and last.ttft_p99 > rule.max_ttft_p99_ms:
        why = f"TTFT p99 {last.ttft_p99:.0f} ms passed the cap of {rule.max_ttft_p99_ms:g} ms"
    elif len(points) >= 2 and _flat(points[-2], last, rule.min_gain):
        prev = points[-2]
        why = (f"output throughput grew {last.throughput / prev.throughput - 1:+.0%} from concurrency "
               f"{prev.concurrency} to {last.concurrency} (less than {rule.min_gain:.0%}) while TPOT p50 rose "
               f"{prev.tpot_p50:.1f} -> {last.tpot_p50:.1f} ms")
    elif last.concurrency * 2 > rule.max_concurrency:
        why = f"the next level ({last.concurrency * 2}) would pass max_concurrency = {rule.max_concurrency}"
    if why and last.client_bound:
        why += (f"; this level was client-bound (send lateness p99 {last.lateness_p99:.0f} ms > "
                f"{rule.client_lateness_ms:g} ms): the client, not the engine, may have set its pace")
    return why


def _flat(prev: Point, last: Point, min_gain: float) -> bool:
    if not prev.throughput or last.throughput is None or prev.tpot_p50 is None or last.tpot_p50 is None:
        return False
    return last.throughput / prev.throughput - 1 < min_gain and last.tpot_p50 > prev.tpot_p50


def refine(points: list[Point], rule: Any) -> list[int]:
    """Concurrencies to add (at most `rule.refine`): the geometric midpoint of the last two levels, then of
    every adjacent pair whose throughputs differ by more than `rule.refine_ratio`, largest ratio first;
    a midpoint that rounds onto a measured level is skipped."""
    done = {p.concurrency for p in points}
    by_c = sorted(points, key=lambda p: p.concurrency)
    pairs = [(points[-2], points[-1])] if len(points) >= 2 else []
    jumps = [(a, b) for a, b in zip(by_c, by_c[1:]) if a.throughput and b.throughput
             and max(a.throughput, b.throughput) / min(a.throughput, b.throughput) > rule.refine_ratio]
    pairs += sorted(jumps, key=lambda ab: -max(ab[0].throughput, ab[1].throughput) / min(ab[0].throughput, ab[1].throughput))
    out: list[int] = []
    for a, b in pairs:
        mid = round(math.sqrt(a.concurrency * b.concurrency))
        if mid not in done and len(out) < rule.refine:
            out.append(mid)
            done.add(mid)
    return out


def point(concurrency: int, records: list[dict[str, Any]], level: dict[str, Any], rule: Any) -> Point:
    """The stop rule's view of one level: the client's records and the engine's own counters around it."""
    s = metrics.summarize(records)
    late = metrics.stats(metrics.lateness_ms(records))
    p = saturation.pressure(level.get("server_view"), level.get("observer") or {}, s)
    return Point(concurrency, s.get("output_throughput"), (s.get("tpot_ms") or {}).get("median"),
                 (s.get("ttft_ms") or {}).get("p99"), p.get("preemptions"), p.get("queue_share"), late["p99"],
                 late["p99"] is not None and late["p99"] > rule.client_lateness_ms)


class Pool:
    """Fresh requests for a sweep: successive slices of the workload grown as needed (its prompts are a
    seeded sequence, so a longer build starts with the shorter one's); nothing is handed out twice, and
    no prompt twice either (real-text questions come from a finite set: a repeat is skipped, so no level
    gets a free prefix-cache hit; a workload with too few distinct prompts is a ValueError naming it).
    Building costs ~0.1 s (the tokenizer), which would stall the client's event loop mid-level and show as
    lateness and TPOT: `reserve` builds enough before a level, outside its measurement, and a level that
    still runs short grows the pool in a thread (`grown_mid_level` counts those)."""

    def __init__(self, plan: Any):
        self.plan, self.chains, self.fresh = plan, [], []  # every chain built; those not handed out, not seen
        self.seen: set[tuple[int, ...]] = set()
        self.grown_mid_level, self.exhausted = 0, None
        self._add(chains(plan.items))

    def _add(self, built: list[list[Any]]) -> None:
        for ch in built[len(self.chains):]:
            key = tuple(ch[0].prompt_token_ids)
            if key not in self.seen:
                self.seen.add(key)
                self.fresh.append(ch)
        self.chains = built

    def _grow(self, n: int) -> None:
        size = max(len(self.chains), 1)
        while len(self.fresh) < n:
            size *= 2
            if size > 64 * (len(self.seen) + n):
                raise ValueError(f"the workload has {len(self.seen)} distinct prompts; a sweep level needs {n} more")
            from experiments.workload import workloads

            w = self.plan.cfg.workload.model_copy(update={"num_requests": size})
            self._add(chains(workloads.build(self.plan.cfg.model, w, 0)[0]))

    def reserve(self, n: int) -> None:
        """At least n fresh chains, built now (between levels)."""
        self._grow(n)

    def take_now(self, n: int) -> list[list[Any]]:
        self._grow(n)
        out, self.fresh = self.fresh[:n], self.fresh[n:]
        return out

    async def take(self, n: int) -> list[list[Any]]:
        """Mid-level: n more fresh chains, built in a thread if needed; fewer (the level ends early, and
        `exhausted` says why) when the workload has no more distinct prompts."""
        if len(self.fresh) < n:
            self.grown_mid_level += 1
            try:
                await asyncio.to_thread(self._grow, n)
            except ValueError as e:
                self.exhausted = str(e)
        out, self.fresh = self.fresh[:n], self.fresh[n:]
        return out


def expected(c: int, rates: dict[int, float], level_s: float) -> int:
    """Requests a level at concurrency c may send in level_s: the nearest measured level's request rate scaled
    to c users (an over-estimate past saturation, which only reserves more), with half again for safety."""
    if not rates:
        return max(16 * c, 64)
    near = min(rates, key=lambda k: abs(math.log(k / c)))
    return math.ceil(rates[near] * c / near * level_s * 1.5) + 2 * c


async def levels(er: Any, engine: Any, info: Any, sampler: Any) -> AsyncIterator[str | None]:
    """Run the sweep's levels through `er._level` (an EngineRun); yields each level's failure. The manifest's
    repeat entry gets `sweep`: every level's point, why the sweep stopped, and the refined levels."""
    rule = er.plan.cfg.load.sweep
    pool, points, rates = Pool(er.plan), [], {}
    rec: dict[str, Any] = {"points": [], "stopped": None, "refined": [], "level_s": rule.level_s}
    er.rep["sweep"] = rec
    er.done = {}  # a sweep never resumes half-way: its levels depend on what came before

    async def run(c: int) -> str | None:
        try:
            pool.reserve(expected(c, rates, rule.level_s))
        except ValueError as e:  # a ShareGPT file with fewer usable conversations than the level needs
            return f"sweep level at concurrency {c} for {rule.level_s:g} s: {e} (lower load.sweep.level_s)"
        grown = pool.grown_mid_level
        first = pool.take_now(c)
        failure = await er._level(engine, info, sampler, "concurrency", c, [it for ch in first for it in ch],
                                  until_s=rule.level_s, more=pool.take)
        if not failure:
            lv = er.manifest["levels"][f"concurrency={c:g}"][str(er.repeat)]
            points.append(point(c, er.last_records, lv, rule))
            rates[c] = len(er.last_records) / max(metrics.wall_seconds(er.last_records), 1e-9)
            rec["points"].append({**vars(points[-1]), "level": f"concurrency={c:g}",
                                  "pool_grown_mid_level": pool.grown_mid_level - grown,
                                  "ended_early": pool.exhausted})
        return failure

    c = rule.start
    while True:
        failure = await run(c)
        yield failure
        if failure:
            return
        why = stop_reason(points, rule)
        if why:
            rec["stopped"] = why
            break
        c *= 2
    for c in refine(points, rule):
        rec["refined"].append(c)
        failure = await run(c)
        yield failure
        if failure:
            return
