"""The soak's verdict lines, `VERDICT <name>: PASS|MISS|SKIP — why`, from the records and samples.

- no-5xx: no response >= 500 and no error event inside a 200 stream, in any phase (search, probes, soak);
- invalid-4xx: every invalid request got a 4xx;
- valid-complete: every valid request got a 200 and, unless the client cut it, its whole answer: [DONE],
  a finish reason for each of its n choices, logprobs where asked;
- blocks-returned: with the load stopped and the server idle, 0 KV blocks in use;
- probes-identical: the greedy probes' token ids at the end equal those at the start;
- rss-slope: least-squares slope of the tree's RSS over the samples after warm-up, < 1 MiB/min;
- latency-drift: p99 TTFT and p99 TPOT (interactive requests, by send time) in the last window
  within 10 % (either way) of the first window after warm-up.

Windows (`windows`): a run of 10 minutes or more warms up for min(5 min, 20 %) and compares the first
5 minutes after warm-up with the last 5; a shorter run warms up for 20 % of it and compares the
quarter after warm-up with the last quarter. The last two are timing verdicts: a mechanism run (CI)
prints them as SKIP with the numbers, unjudged.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from experiments.measuring import metrics
from experiments.soak.mix import INTERACTIVE
from experiments.soak.observe import server_error

RSS_SLOPE_MIB_PER_MIN = 1.0
DRIFT = 0.10
TIMING = ("rss-slope", "latency-drift")
NAMES = ("no-5xx", "invalid-4xx", "valid-complete", "blocks-returned", "probes-identical") + TIMING


def windows(total_s: float) -> tuple[float, tuple[float, float], tuple[float, float]]:
    """(warm-up seconds, first window, last window), in seconds from the soak's start."""
    if total_s >= 600:
        warm, win = min(300.0, 0.2 * total_s), 300.0
    else:
        warm, win = 0.2 * total_s, 0.25 * total_s
    return warm, (warm, warm + win), (total_s - win, total_s)


def rss_slope(rows: list[dict], warm_s: float) -> float | None:
    """MiB per minute over the samples at or after `warm_s`; None with fewer than 3."""
    pts = [(r["t_s"] / 60, r["rss_mib"]) for r in rows if r["t_s"] >= warm_s and r["rss_mib"] > 0]  # 0: no server
    if len(pts) < 3:
        return None
    t, y = np.array(pts).T
    return float(np.polyfit(t, y, 1)[0])


def window_p99(records: list[dict], t0_ns: int, win: tuple[float, float]) -> dict:
    rows = [metrics.per_request(r) for r in records
            if r["kind"] in INTERACTIVE and r["status"] == 200 and r["done"] and not r["cut"]
            and win[0] <= (r["send_ns"] - t0_ns) / 1e9 < win[1]]
    return {"n": len(rows), "ttft": metrics.stats(r["ttft_ms"] for r in rows)["p99"],
            "tpot": metrics.stats(r["tpot_ms"] for r in rows)["p99"]}


def whole(r: dict) -> bool:
    if r["status"] != 200 or r["error"]:
        return False
    return r["cut"] or (r["done"] and len(r["finish"]) == r["n"] and (r["logprob_chunks"] > 0 or not r["logprobs"]))


def _cause(error: str) -> str:
    """"transport: ClientConnectorError: ..." -> "transport ClientConnectorError"; "in-stream: {...}" -> "in-stream"."""
    head, _, rest = error.partition(":")
    return f"{head} {rest.split(':')[0].strip()}" if head == "transport" else head


def _line(name: str, ok: bool | None, why: str, judged: bool = True) -> tuple[str, str, str]:
    status = "SKIP" if not judged or ok is None else ("PASS" if ok else "MISS")
    return name, status, why


def verdicts(records: list[dict], soak: list[dict], rows: list[dict], t0_ns: int, total_s: float,
             blocks_end: dict, probes: tuple[list, list], mechanism: bool) -> list[tuple[str, str, str]]:
    """`records`: every request of the run; `soak`: those of the soak phase (the windows read them)."""
    out = []
    bad = [r for r in records if server_error(r)]
    kinds = sorted({f"{r['status']} {r['kind']}" for r in bad})
    out.append(_line("no-5xx", not bad, f"{len(bad)} server errors in {len(records)} requests"
                     + (f" ({', '.join(kinds)})" if kinds else "")))
    inv = [r for r in records if r["kind"] == "invalid"]
    wrong = sorted({f"{r['name']}={r['status']}" for r in inv if not 400 <= (r["status"] or 0) < 500})
    out.append(_line("invalid-4xx", bool(inv) and not wrong, f"{len(inv) - len(wrong)}/{len(inv)} invalid requests "
                     "got a 4xx" + (f"; not: {', '.join(wrong)}" if wrong else "")))
    valid = [r for r in records if r["kind"] != "invalid"]
    broken = [r for r in valid if not whole(r)]
    why = Counter(f"{r['kind']} {r['status']}" + (" " + _cause(r["error"]) if r["error"] else "") for r in broken)
    out.append(_line("valid-complete", not broken, f"{len(valid) - len(broken)}/{len(valid)} valid requests answered "
                     "whole or cut by the client" + ("; not: " + ", ".join(f"{k} x{v}" for k, v in why.most_common())
                                                      if why else "")))
    used, total = blocks_end.get("kv_blocks_used"), blocks_end.get("kv_blocks_total")
    out.append(_line("blocks-returned", used == 0, f"{used} of {total} KV blocks in use once idle "
                     f"(running {blocks_end.get('running')}, waiting {blocks_end.get('waiting')})"))
    start, end = probes
    same = sum(a == b for a, b in zip(start, end))
    ok = bool(start) and len(start) == len(end) and same == len(start) and all(start)
    out.append(_line("probes-identical", ok,
                     f"{same}/{len(start)} greedy probes gave the same token ids at start and end"))
    warm, first, last = windows(total_s)
    slope = rss_slope(rows, warm)
    out.append(_line("rss-slope", None if slope is None else slope < RSS_SLOPE_MIB_PER_MIN,
                     (f"{slope:+.3f} MiB/min" if slope is not None else "too few samples")
                     + f" after {warm:.0f} s of warm-up (rule < {RSS_SLOPE_MIB_PER_MIN:g} MiB/min)", not mechanism))
    a, b = window_p99(soak, t0_ns, first), window_p99(soak, t0_ns, last)
    drift, parts = [], []
    for key in ("ttft", "tpot"):
        if a[key] and b[key] is not None:
            drift.append(abs(b[key] / a[key] - 1))
            parts.append(f"p99 {key.upper()} {a[key]:.0f} -> {b[key]:.0f} ms ({b[key] / a[key] - 1:+.0%})")
    ok = None if len(drift) < 2 else max(drift) <= DRIFT
    out.append(_line("latency-drift", ok, ("; ".join(parts) or "no data")
                     + f" [{first[0]:.0f}-{first[1]:.0f} s: {a['n']} requests; {last[0]:.0f}-{last[1]:.0f} s: "
                     f"{b['n']}] (rule: within {DRIFT:.0%})", not mechanism))
    return out


def format_lines(lines: list[tuple[str, str, str]], mechanism: bool) -> list[str]:
    tag = " (mechanism run: not judged)"
    return [f"VERDICT {n}: {s} — {w}{tag if mechanism and n in TIMING else ''}" for n, s, w in lines]


def misses(lines: list[tuple[str, str, str]]) -> int:
    return sum(s == "MISS" for _, s, _ in lines)
