"""N replicas behind a router in simulated time, without asyncio: the capacity planner's loop.

A discrete-event loop over two kinds of events: an arrival (the router picks a replica, which starts
a step at once if idle) and a replica's step end (its tokens are delivered at that time, then it
starts its next step if it has work). Per request only what the SLO needs is kept (send, first and
last token time, tokens), so 10^5 requests fit in memory; `inferlab simulate` without `--capacity`
writes full per-request records through the harness instead (replay.py).

Invariant: with one replica and the same arrivals, a request's first and last token times are those
the harness path (served.py) records: both start a step when the replica has work and deliver its
tokens at the step's end.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Sequence

from experiments.simulate.replica import Replica
from reference_engine.engine.router import Router


@dataclass
class Arrival:
    t: float
    request_id: str
    prompt: list[int]
    max_tokens: int
    out_len: int | None = None


@dataclass
class Done:
    request_id: str
    replica: int
    send: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0


@dataclass
class ReplicaStats:
    steps: int = 0
    busy_s: float = 0.0
    preemptions: int = 0
    kv_peak: float = 0.0  # fraction of blocks in use, highest after any step
    kv_time: float = 0.0  # integral of the fraction over busy time
    requests: int = 0
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0

    def summary(self, wall: float) -> dict[str, float]:
        return {"requests": self.requests, "steps": self.steps, "busy": self.busy_s / wall if wall else 0.0,
                "preemptions": self.preemptions, "kv_peak": self.kv_peak,
                "kv_mean": self.kv_time / self.busy_s if self.busy_s else 0.0,
                "prefix_hit_rate": self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0}


@dataclass
class Fleet:
    replicas: list[Replica]
    router: Router
    stats: list[ReplicaStats] = field(init=False)

    def __post_init__(self) -> None:
        self.stats = [ReplicaStats() for _ in self.replicas]

    def run(self, arrivals: Sequence[Arrival]) -> tuple[list[Done], float]:
        """Serve `arrivals` (sorted by time); returns each request's times and the wall time
        (first arrival -> last token)."""
        done: dict[str, Done] = {}
        ends: list[tuple[float, int]] = []  # (step end, replica) of replicas mid-step
        pending: list = [None] * len(self.replicas)  # the step each busy replica is running
        i = 0
        while i < len(arrivals) or ends:
            if i < len(arrivals) and (not ends or arrivals[i].t <= ends[0][0]):
                a = arrivals[i]
                i += 1
                k = self.router.pick(a.prompt, self.replicas)
                self.replicas[k].add(a.request_id, a.prompt, a.max_tokens, a.out_len, a.t)
                self.stats[k].requests += 1
                done[a.request_id] = Done(a.request_id, k, a.t)
                if pending[k] is None:
                    self._start(k, a.t, pending, ends)
                continue
            t, k = heapq.heappop(ends)
            res, pending[k] = pending[k], None
            for e in res.emitted:
                d = done[e.request_id]
                d.first = t if d.first is None else d.first
                d.last, d.tokens = t, d.tokens + e.n_tokens
            self._start(k, t, pending, ends)
        out = list(done.values())
        wall = max((d.last or d.send for d in out), default=0.0) - (arrivals[0].t if arrivals else 0.0)
        return out, wall

    def _start(self, k: int, now: float, pending: list, ends: list) -> None:
        r, st = self.replicas[k], self.stats[k]
        q, h = r.sched.kv.queries, r.sched.kv.hits
        res = r.step() if r.has_work() else None
        if res is None:
            return
        st.prefix_query_tokens += r.sched.kv.queries - q
        st.prefix_hit_tokens += r.sched.kv.hits - h
        st.steps += 1
        st.busy_s += res.duration_s
        st.preemptions += len(res.preempted)
        frac = r.kv_used_fraction()
        st.kv_peak = max(st.kv_peak, frac)
        st.kv_time += frac * res.duration_s
        pending[k] = res
        heapq.heappush(ends, (now + res.duration_s, k))
