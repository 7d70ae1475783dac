"""The server's own view of a measured level: its latency histograms and counters, read
as deltas between one scrape just before the level and one just after it.

Why only before and after: on a small machine, fetching an engine's /metrics during a
level stalls its front end (vLLM-CPU: TTFT x1.5-5 with a scrape every 0.5 s), so the
default harness sends nothing but the workload while it measures. Every scrape here runs
in a worker thread with its own HTTP client, so the parse never blocks the event loop
that timestamps token events, and each scrape's own latency is kept.

Names come from each engine's spec (`EngineSpec.metrics`); an engine with no table (e.g. the generic
`openai` adapter in front of vLLM) gets the table whose histograms its text holds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from adapters import registry
from adapters.transport import prom
from adapters.transport.metric_names import MetricNames


@dataclass
class Scrape:
    """One fetch of an engine's Prometheus text, reduced to what the view needs."""

    ok: bool
    latency_ms: float
    histograms: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> {sum, count, buckets}
    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def names_for(engine: str, text: str | None = None) -> MetricNames | None:
    """The engine's table (its spec's), else, for an engine without one (the generic `openai` adapter in front
    of any server), the table whose latency histograms `text` holds most completely: vLLM's text has all four
    of vLLM's, and `inferlab serve`'s has all three of its own (no TPOT) but not vLLM's fourth."""
    spec = registry.spec(engine)
    if spec is not None and spec.metrics is not None:
        return spec.metrics
    if not text:
        return None
    best, score = None, (0.0, 0)
    for t in (s.metrics for s in registry.specs() if s.metrics is not None):
        names = [h for h in (t.ttft, t.itl, t.tpot, t.e2e) if h]
        found = sum(f"{h}_count" in text for h in names)
        if found and (found / len(names), found) > score:  # the most complete, then the most histograms
            best, score = t, (found / len(names), found)
    return best


def reduce(m: prom.Metrics, names: MetricNames) -> tuple[dict, dict, dict]:
    """Histograms (summed over label sets, which is exact for histograms), counters (summed)
    and gauges (ratios averaged over label sets, counts summed) out of parsed metrics."""
    hists: dict[str, dict[str, Any]] = {}
    for key, base in names.histograms().items():
        if f"{base}_count" not in m:
            continue
        buckets: dict[float, float] = {}
        for labels, v in m.samples.get(f"{base}_bucket", []):
            le = float(labels.get("le", "inf"))
            buckets[le] = buckets.get(le, 0.0) + v
        hists[key] = {"sum": m.value(f"{base}_sum") or 0.0, "count": m.value(f"{base}_count") or 0.0,
                      "buckets": sorted(buckets.items())}
    counters = {}
    for key, alts in names.counters().items():
        v = m.value(*alts)
        if v is not None:
            counters[key] = v
    gauges = {}
    for key, alts, mean in (("kv_usage", names.kv_usage, True), ("running", names.running, False),
                            ("waiting", names.waiting, False)):
        name = next((a for a in alts if a in m), None)
        if name is not None:
            vals = [v for _, v in m.samples[name]]
            gauges[key] = sum(vals) / len(vals) if mean else sum(vals)
    return hists, counters, gauges


def scrape(url: str, names: MetricNames | None, engine: str = "", timeout_s: float = 10.0,
           client: httpx.Client | None = None) -> tuple[Scrape, MetricNames | None]:
    """GET `url` and reduce it (blocking: call it from a worker thread). Never raises."""
    t0 = time.perf_counter()
    try:
        if client is None:
            with httpx.Client(trust_env=False, timeout=timeout_s) as c:
                resp = c.get(url)
        else:
            resp = client.get(url)
        latency = (time.perf_counter() - t0) * 1e3
        if resp.status_code != 200:
            return Scrape(False, latency, error=f"HTTP {resp.status_code}"), names
        text = resp.text
        names = names or names_for(engine, text)
        if names is None:
            return Scrape(False, latency, error="no metric-name table matches this engine"), None
        m = prom.Metrics.parse(text, names.prefixes())
    except (httpx.HTTPError, ValueError) as e:
        return Scrape(False, (time.perf_counter() - t0) * 1e3, error=f"{type(e).__name__}: {e}"[:200]), names
    hists, counters, gauges = reduce(m, names)
    return Scrape(True, latency, hists, counters, gauges), names


def delta(before: Scrape, after: Scrape) -> dict[str, Any]:
    """What happened between two scrapes: per histogram count, sum and mean (ms), per counter
    the increase. Histograms and counters only grow; a smaller value means the server restarted."""
    out: dict[str, Any] = {"histograms": {}, "counters": {}}
    if not (before.ok and after.ok):
        out["error"] = before.error or after.error
        return out
    for key, a in after.histograms.items():
        b = before.histograms.get(key, {"sum": 0.0, "count": 0.0, "buckets": []})
        n, s = a["count"] - b["count"], a["sum"] - b["sum"]
        prev = dict(b["buckets"])
        out["histograms"][key] = {"count": n, "sum_s": s, "mean_ms": s / n * 1e3 if n > 0 else None,
                                  "buckets": [(le, c - prev.get(le, 0.0)) for le, c in a["buckets"]]}
    for key, v in after.counters.items():
        out["counters"][key] = v - before.counters.get(key, 0.0)
    return out


def settled(before: Scrape, after: Scrape, expected: int) -> bool:
    """True when the after-scrape has counted all `expected` requests in its TTFT or E2E
    histogram (a server may record a request's stats just after sending its last chunk)."""
    d = delta(before, after)
    hs = d["histograms"]
    key = "e2e" if "e2e" in hs else ("ttft" if "ttft" in hs else None)
    return key is None or hs[key]["count"] >= expected
