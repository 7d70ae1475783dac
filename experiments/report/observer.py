"""The report's "client vs the server's own view" section and the observer's flags.

Per engine and level: the client's TTFT / ITL / TPOT / E2EL means beside the same
requests' means from the engine's own histograms (scraped just before and just after the
level), the difference, and a flag where they disagree beyond the limits in
experiments/measuring/observer.py, named on the client's or the server's side where the adapter stamped
the request's wire times (experiments/measuring/wire.py, also tabled). Also the cost of every scrape, and
whether a timeline ran.
"""
from __future__ import annotations

from typing import Any

from experiments.measuring import observer, wire
from experiments.report.md import fmt, table
from experiments.report.summary import Runs

METRICS = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2EL"))


def _each(runs: Runs):
    """(engine, level, summary) for every level an engine finished requests at."""
    for e in runs.engines:
        for level in runs.levels:
            if e.summary.get(level):
                yield e, level, e.summary[level]


def section(runs: Runs) -> list[str]:
    rows = []
    for e, level, s in _each(runs):
        cmp = s.get("client_vs_server")
        if cmp is None:
            rows.append([e.label, level, "–", "–", "–", "–", _why_none(e, s)])
            continue
        for key, name in METRICS:
            r = cmp["rows"].get(key)
            if r is None:
                continue
            diff = r["diff_ms"]
            rel = f"{diff / r['server_ms']:+.0%}" if diff is not None and r["server_ms"] else "–"
            rows.append([e.label, level, name, fmt(r["client_ms"]), fmt(r["server_ms"]),
                         f"{fmt(diff)} ({rel})", f"{fmt(int(r['server_count']))} counted"])
    if not rows:
        return ["No engine in this report exports latency histograms."]
    intro = ("Client means against the engine's own histograms for the same requests (one scrape of its "
             "Prometheus metrics just before the level, one just after; nothing reaches the engine during the "
             f"level unless a timeline is configured). A level is flagged when the client's TTFT exceeds the "
             f"server's by more than {observer.TTFT_ABS_MS:g} ms + {observer.TTFT_REL:.0%}, or ITL/E2EL differ by "
             f"more than {observer.ITL_REL:.0%}. The client's TTFT includes the HTTP round trip and the server's "
             "request parsing, so a few milliseconds above the server's is expected.")
    return [intro, ""] + table(["engine", "level", "metric", "client mean (ms)", "server mean (ms)",
                                "client − server (ms)", "server saw"], rows) + [""] + _tokens(runs) + _wire(runs) + \
        _scrapes(runs)


def _tokens(runs: Runs) -> list[str]:
    """The engine's own prompt and generation token counters over each level against the client's counts
    (an engine with counters but no latency histograms, e.g. llama.cpp, shows its view here)."""
    rows = []
    for e, level, merged in _each(runs):
        each = merged.get("per_repeat") or {"": merged}  # repeats: each its own scrapes
        for r, s in each.items():
            c = ((s.get("server_view") or {}).get("counters")) or {}
            if "generation_tokens" in c or "prompt_tokens" in c:
                rows.append([e.label, f"{level} (repeat {r})" if r else level,
                             *(f"{int(v):,}" if v is not None else "–" for v in (
                                 c.get("prompt_tokens"), s.get("prompt_tokens"), c.get("generation_tokens"),
                                 s.get("output_tokens")))])
    if not rows:
        return []
    return ["Tokens the engine's own counters saw over the level, against the client's counts:", ""] + \
        table(["engine", "level", "prompt tokens (server)", "prompt tokens (client)", "generated (server)",
               "generated (client)"], rows) + [""]


def _wire(runs: Runs) -> list[str]:
    """Where the time before the first token went (experiments/measuring/wire.py), for HTTP adapters."""
    rows = []
    for e, level, s in _each(runs):
        w = s.get("wire")
        if not w:
            continue
        gap = (((s.get("client_vs_server") or {}).get("rows") or {}).get("ttft") or {}).get("diff_ms")
        front = w.get("front_ms") or {}
        rows.append([e.label, level, fmt(w["write_ms"]["mean"]), fmt(w["write_ms"]["p99"]), fmt(front.get("mean")),
                     fmt(front.get("p99")), fmt(gap)])
    if not rows:
        return []
    return ["Before the first token, per request (ms): from the send to the request's last byte leaving the client "
            "(the client's own queue), and from there to the response's headers coming back (the server's front "
            "end: its latency clock starts inside this span, so the span bounds the wait its histograms leave out).",
            ""] + table(["engine", "level", "client write mean", "client write p99", "out → headers mean",
                         "out → headers p99", "client − server TTFT"], rows) + [""]


def _why_none(e, s: dict[str, Any]) -> str:
    view = s.get("server_view")
    if view and view.get("error"):
        return f"scrape failed: {view['error']}"
    if (e.manifest.get("info") or {}).get("metrics_url"):
        return "no latency histograms in its metrics"
    return "the engine exports no metrics"


def _scrapes(runs: Runs) -> list[str]:
    rows = []
    for e, level, s in _each(runs):
        view, tl = s.get("server_view") or {}, (s.get("observer") or {}).get("timeline")
        ms = view.get("scrape_ms") or [None, None]
        rows.append([e.label, level, fmt(ms[0]), fmt(ms[1]),
                     f"every {tl['every_s']:g} s: {tl['scrapes']} scrapes, mean {fmt(tl['scrape_ms_mean'])} ms, "
                     f"max {fmt(tl['scrape_ms_max'])} ms" if tl else "off"])
    return ["What the harness asked of each engine besides the workload (scrape latencies in ms):", ""] + \
        table(["engine", "level", "scrape before", "scrape after", "timeline during the level"], rows)


def flags(e, level: str, s: dict[str, Any]) -> list[str]:
    """Flag lines for one engine and level (each repeat's own, when there were several):
    server disagreement, implausible readings, a timeline."""
    if s.get("per_repeat"):
        return [line for r, rs in s["per_repeat"].items() for line in flags(e, f"{level} (repeat {r})", rs)]
    out = []
    cmp = s.get("client_vs_server")
    if cmp and cmp["flags"]:
        out.append(f"- **{e.label}** {level}: " + "; ".join(cmp["flags"]) + f" — {wire.cause(cmp, s.get('wire'))}.")
    for line in s.get("implausible") or []:
        out.append(f"- **{e.label}** {level}: {line}.")
    note = observer.handed_late(s.get("bunched") or {})
    if note:
        out.append(f"- **{e.label}** {level}: {note}.")
    tl = (s.get("observer") or {}).get("timeline")
    if tl:
        out.append(f"- **{e.label}** {level}: possibly perturbed by the observer: the engine's gauges were "
                   f"scraped every {tl['every_s']:g} s during the level ({tl['scrapes']} scrapes, max "
                   f"{fmt(tl['scrape_ms_max'])} ms each).")
    return out
