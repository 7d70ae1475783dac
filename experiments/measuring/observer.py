"""Keeping the observer off the measured path, and proving it stayed off.

During a measured level the harness sends the engine nothing but the workload. What it
wants to know of the engine's state it asks before and after (`Bracket`): the adapter's
snapshot (KV, running, waiting) and, for engines that export Prometheus text, one scrape
for the server's own latency histograms (experiments/measuring/server_view.py). A timeline of the
engine's gauges *during* the level is opt-in (`[observer] timeline_s`); every timeline
scrape's latency is kept and the level is flagged as possibly perturbed.

Where a server's view exists, `compare` sets the client's numbers beside it; `bunched`
finds one-token-per-event streams whose tokens arrived in a burst after a stall, and
`LoopWatch` says whose stall it was: a client whose event loop woke up late across the gap
may have read the tokens late (the reading is not the engine's); a client whose loop kept
waking on time was handed them late (the engine's front end stalled: its users see that too).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict
from typing import Any

import httpx
import numpy as np

from adapters.base import Engine, EngineInfo

# A level is flagged when the client's TTFT mean exceeds the server's by more than
from experiments.measuring import server_view
from experiments.running import clock

# TTFT_ABS_MS + TTFT_REL x server, or the ITL (or E2EL) means differ by more than ITL_REL.
TTFT_ABS_MS, TTFT_REL, ITL_REL = 15.0, 0.10, 0.10
SETTLE_S = 3.0  # how long the after-scrape waits for the server to count the level's last requests


class Timeline:
    """Opt-in: the engine's KV and queue gauges every `every_s`, scraped and parsed in the
    memory sampler's thread (never on the event loop that stamps token events). Engines
    without a metrics URL are asked through their adapter's `snapshot()` on the loop."""

    def __init__(self, engine: Engine, info: EngineInfo, loop: asyncio.AbstractEventLoop, every_s: float):
        self.engine, self.info, self.loop, self.every = engine, info, loop, every_s
        self.names = server_view.names_for(info.engine)
        self.client = httpx.Client(trust_env=False, timeout=5.0) if info.metrics_url else None
        self.latencies_ms: list[float] = []
        self.errors = 0
        self._next = 0.0

    def due(self) -> bool:
        return time.perf_counter() >= self._next

    def sample(self) -> dict[str, Any]:
        self._next = time.perf_counter() + self.every
        t0 = time.perf_counter()
        out: dict[str, Any] = {}
        try:
            if self.client is not None:
                sc, self.names = server_view.scrape(self.info.metrics_url, self.names, self.info.engine,
                                                    client=self.client)
                if not sc.ok:
                    raise RuntimeError(sc.error)
                g = sc.gauges
                out = {"kv_usage": g.get("kv_usage"), "num_running": g.get("running"),
                       "num_waiting": g.get("waiting")}
            else:
                snap = asyncio.run_coroutine_threadsafe(self.engine.snapshot(), self.loop).result(timeout=5.0)
                out = {"kv_usage": snap.kv_usage, "num_running": snap.num_running, "num_waiting": snap.num_waiting}
        except Exception:  # engine busy or gone: the latency still counts
            self.errors += 1
        ms = (time.perf_counter() - t0) * 1e3
        self.latencies_ms.append(ms)
        cap = self.info.kv_capacity_tokens
        if out.get("kv_usage") is not None and cap:
            out["kv_used_tokens"] = round(out["kv_usage"] * cap)
            out["kv_capacity_tokens"] = cap
        out["timeline_scrape_ms"] = ms
        return out

    def summary(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {"every_s": self.every, "scrapes": len(lat), "errors": self.errors,
                "scrape_ms_mean": float(np.mean(lat)) if lat else None,
                "scrape_ms_max": float(np.max(lat)) if lat else None}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class LoopWatch:
    """How late the client's event loop woke up during a level: a task sleeps `every_s` and
    keeps each wake-up more than `late_ms` late as (woke_ns, late_ms). Tokens that arrive in
    a burst when the loop has just woken late were waiting for the client; tokens that arrive
    in a burst while it kept waking on time were waiting upstream. One timer wake-up per
    `every_s`, on the client only; the engine is sent nothing."""

    LIMIT = 1000  # late wake-ups kept per level

    def __init__(self, every_s: float = 0.01, late_ms: float = 20.0):
        self.every, self.late_ms = every_s, late_ms
        self.late: list[tuple[int, float]] = []
        self.wakeups = 0
        self.task: asyncio.Task | None = None

    def start(self) -> "LoopWatch":
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        step = int(self.every * 1e9)
        while True:
            due = clock.now_ns() + step
            await asyncio.sleep(self.every)
            now = clock.now_ns()
            self.wakeups += 1
            late = (now - due) / 1e6
            if late > self.late_ms and len(self.late) < self.LIMIT:
                self.late.append((now, late))

    async def stop(self) -> dict[str, Any]:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        return {"every_s": self.every, "late_ms": self.late_ms, "wakeups": self.wakeups,
                "late": [[t, round(ms, 3)] for t, ms in self.late],
                "max_late_ms": max((ms for _, ms in self.late), default=None)}


class Bracket:
    """The engine's state just before and just after one measured level."""

    def __init__(self, engine: Engine, info: EngineInfo):
        self.engine, self.info = engine, info
        self.names = server_view.names_for(info.engine)
        self.before: server_view.Scrape | None = None
        self.snap_before: dict[str, Any] | None = None

    async def _snap(self) -> dict[str, Any] | None:
        try:
            s = asdict(await asyncio.wait_for(self.engine.snapshot(), 10))
            s.pop("t_ns", None)
            return s
        except Exception:  # an engine that cannot report: the level still runs
            return None

    async def _scrape(self) -> server_view.Scrape | None:
        if not self.info.metrics_url:
            return None
        sc, self.names = await asyncio.to_thread(server_view.scrape, self.info.metrics_url, self.names,
                                                 self.info.engine)
        return sc

    async def open(self) -> None:
        self.snap_before = await self._snap()
        self.before = await self._scrape()

    async def close(self, sent: int) -> dict[str, Any]:
        """Scrape after the level (waiting up to SETTLE_S for the server to count every request)."""
        out: dict[str, Any] = {"snapshot_before": self.snap_before}
        after = await self._scrape()
        deadline = clock.now_s() + SETTLE_S
        while (after is not None and self.before is not None and after.ok
               and not server_view.settled(self.before, after, sent) and clock.now_s() < deadline):
            await asyncio.sleep(0.1)
            after = await self._scrape()
        out["snapshot_after"] = await self._snap()
        if self.before is not None and after is not None:
            out["server_view"] = {"table": self.names.engine if self.names else None,
                                  "scrape_ms": [self.before.latency_ms, after.latency_ms],
                                  **server_view.delta(self.before, after)}
        return out


def compare(client: dict[str, Any], view: dict[str, Any] | None) -> dict[str, Any] | None:
    """Client means beside the server's, for the metrics both have, with the disagreements."""
    if not view or view.get("error"):
        return None
    hs = view.get("histograms", {})
    rows: dict[str, dict[str, Any]] = {}
    for key, ckey in (("ttft", "ttft_ms"), ("itl", "itl_ms"), ("tpot", "tpot_ms"), ("e2e", "e2el_ms")):
        h = hs.get(key)
        if not h or h.get("mean_ms") is None:
            continue
        c = (client.get(ckey) or {}).get("mean")
        rows[key] = {"client_ms": c, "server_ms": h["mean_ms"], "server_count": h["count"],
                     "diff_ms": c - h["mean_ms"] if c is not None else None}
    flags = []
    t = rows.get("ttft")
    if t and t["diff_ms"] is not None and t["diff_ms"] > TTFT_ABS_MS + TTFT_REL * t["server_ms"]:
        flags.append(f"client TTFT mean {t['client_ms']:.1f} ms exceeds the server's own {t['server_ms']:.1f} ms "
                     f"by {t['diff_ms']:.1f} ms (limit {TTFT_ABS_MS:g} ms + {TTFT_REL:.0%})")
    for key, what in (("itl", "ITL"), ("e2e", "E2EL")):
        r = rows.get(key)
        if r and r["diff_ms"] is not None and r["server_ms"] > 0 and abs(r["diff_ms"]) > ITL_REL * r["server_ms"]:
            flags.append(f"client {what} mean {r['client_ms']:.2f} ms differs from the server's own "
                         f"{r['server_ms']:.2f} ms by {r['diff_ms'] / r['server_ms']:+.0%} (limit ±{ITL_REL:.0%})")
    return {"rows": rows, "flags": flags}


def bunched(records: list[dict[str, Any]], ref_gap_ms: float | None,
            loop: dict[str, Any] | None = None) -> dict[str, Any]:
    """Requests streamed one token per event whose tokens arrived bunched after a stall:
    at least a quarter of their tokens came < ref/10 after the previous one, right behind a
    gap > 10 x ref. `ref_gap_ms` is the engine's typical inter-token gap (the server's ITL
    mean, else the client's median gap). With the level's `LoopWatch` summary (`loop`), a
    burst counts against the client (`requests`) only when the loop woke up at least half the
    stall late between the stall's start and just after the burst; the others were handed
    over late by the engine (`engine_side`). Without it every burst counts against the client.
    Returns both counts and the worst example of each."""
    if not ref_gap_ms or ref_gap_ms <= 0:
        return {"requests": 0}
    fast, slow = ref_gap_ms / 10 * 1e6, ref_gap_ms * 10 * 1e6  # ns
    late = (loop or {}).get("late") or []
    out: dict[str, Any] = {"requests": 0, "example": None, "engine_side": 0, "engine_example": None,
                           "ref_gap_ms": ref_gap_ms, "loop_watched": loop is not None}
    for r in records:
        ev = r["events"]
        if len(ev) < 4 or any(n != 1 for _, n in ev):
            continue
        t = np.array([e[0] for e in ev], dtype=np.int64)
        gaps = np.diff(t)
        quick = gaps < fast
        stalls = np.nonzero(gaps > slow)[0]
        if quick.sum() * 4 < len(ev) or not len(stalls):
            continue
        i = stalls[0]
        rest = quick[i + 1:]  # the gaps right after the first stall
        burst = len(rest) if rest.all() else int(np.argmin(rest))  # leading quick gaps
        stall_ms = gaps[i] / 1e6
        ex = {"request_id": r["request_id"], "stall_ms": stall_ms, "burst_tokens": burst + 1,
              "burst_ms": float(gaps[i + 1: i + 1 + burst].sum() / 1e6)}
        lo, hi = int(t[i]), int(t[i + 1]) + int(fast) + 5_000_000  # the gap, and 5 ms past the burst's start
        client_late = [ms for woke, ms in late if lo <= woke <= hi]
        ex["loop_late_ms"] = max(client_late, default=0.0)
        key = "requests" if loop is None or ex["loop_late_ms"] >= stall_ms / 2 else "engine_side"
        exk = "example" if key == "requests" else "engine_example"
        out[key] += 1
        if out[exk] is None or stall_ms > out[exk]["stall_ms"]:
            out[exk] = ex
    return out


def implausible(s: dict[str, Any], cmp: dict[str, Any] | None, bunch: dict[str, Any]) -> list[str]:
    """Readings that cannot be the engine's: bunched streams, a TPOT far below the engine's own."""
    out = []
    if bunch.get("requests"):
        ex = bunch["example"]
        out.append(f"{bunch['requests']} request(s) streamed one token per event got a quarter or more of their "
                   f"tokens in bursts after a stall (e.g. {ex['request_id']}: {ex['burst_tokens']} tokens within "
                   f"{ex['burst_ms']:.1f} ms after a {ex['stall_ms']:.0f} ms wait; the engine's typical gap is "
                   f"{bunch['ref_gap_ms']:.2f} ms): the client read them late, so their TTFT/TPOT/ITL are not "
                   "the engine's" + (f" (its event loop woke up {ex['loop_late_ms']:.0f} ms late then)"
                                     if bunch.get("loop_watched") else ""))
    if cmp:
        own = cmp["rows"].get("tpot") or cmp["rows"].get("itl")
        tp = (s.get("tpot_ms") or {}).get("mean")
        if own and tp is not None and own["server_ms"] > 0 and tp < 0.5 * own["server_ms"]:
            out.append(f"client TPOT mean {tp:.2f} ms is far below the engine's own "
                       f"{own['server_ms']:.2f} ms: tokens reached the client in bursts")
    return out


def handed_late(bunch: dict[str, Any]) -> str | None:
    """A note (not a flag) for bursts the engine caused: the client's loop was awake."""
    if not bunch.get("engine_side"):
        return None
    ex = bunch["engine_example"]
    return (f"{bunch['engine_side']} request(s) got a quarter or more of their tokens in bursts after a stall "
            f"while the client's event loop kept waking on time (e.g. {ex['request_id']}: {ex['burst_tokens']} "
            f"tokens within {ex['burst_ms']:.1f} ms after a {ex['stall_ms']:.0f} ms wait, the loop at most "
            f"{ex['loop_late_ms']:.0f} ms late): the engine handed them over late, as its users would see them")
