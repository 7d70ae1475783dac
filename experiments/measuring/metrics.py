"""Metrics exactly as docs/architecture.md defines them, computed after the run from raw records.

A record is one line of requests.jsonl: `send_ns`, `events` = [[recv_ns, n_tokens], ...]
(token-bearing events only), `done_ns`, `output_token_ids`, `prompt_token_ids`, `text`,
`output_len` (the max_tokens asked for), `session` (a resumed run adds sessions), and for
HTTP adapters `sent_ns` / `headers_ns` (the request's last byte out, the response's headers
in; experiments/measuring/wire.py). Every latency counts from `send_ns`, as `vllm bench serve` does.

- TTFT: send -> first event carrying >= 1 token.
- ITL: gap between consecutive token-bearing events, split evenly over the later event's
  tokens (an event with n tokens after a gap g contributes n values of g/n); pooled.
  Tokens that arrive together with the first token are covered by TTFT, not ITL.
- TPOT: (E2EL - TTFT) / (output tokens - 1), per request with >= 2 output tokens.
- E2EL: send -> last token-bearing event.
- Throughput: tokens / benchmark wall time; wall time is first send -> last finish, summed
  over sessions when a run was resumed.
- Goodput: requests meeting every configured SLO / wall time.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

STATS = ("mean", "median", "p90", "p99")
NS_PER_MS = 1e6


def per_request(rec: dict[str, Any]) -> dict[str, Any]:
    """TTFT/TPOT/E2EL (ms) and the split ITL values of one request."""
    ev = rec["events"]
    n_out = len(rec["output_token_ids"])
    row: dict[str, Any] = {"request_id": rec["request_id"], "prompt_tokens": len(rec["prompt_token_ids"]),
                           "output_tokens": n_out, "ttft_ms": np.nan, "tpot_ms": np.nan, "e2el_ms": np.nan,
                           "itl_ms": []}
    if not ev:
        return row
    send = rec["send_ns"]
    ttft = (ev[0][0] - send) / NS_PER_MS
    e2el = (ev[-1][0] - send) / NS_PER_MS
    itl: list[float] = []
    for (t_prev, _), (t, n) in zip(ev, ev[1:]):
        itl.extend([(t - t_prev) / NS_PER_MS / n] * n)
    row.update(ttft_ms=ttft, e2el_ms=e2el, itl_ms=itl)
    if n_out >= 2:
        row["tpot_ms"] = (e2el - ttft) / (n_out - 1)
    return row


def stats(values: Iterable[float]) -> dict[str, float | None]:
    a = np.asarray([v for v in values if v == v], dtype=float)  # drop NaN
    if a.size == 0:
        return {s: None for s in STATS}
    return {"mean": float(a.mean()), "median": float(np.median(a)),
            "p90": float(np.percentile(a, 90)), "p99": float(np.percentile(a, 99))}


def wall_seconds(records: list[dict[str, Any]]) -> float:
    """First send -> last finish, summed over sessions and repeats (the gaps between them
    are not counted)."""
    df = pd.DataFrame({"session": [(r.get("repeat", 1), r.get("session", 0)) for r in records],
                       "send": [r["send_ns"] for r in records],
                       "done": [r["done_ns"] for r in records]})
    g = df.groupby("session").agg(first=("send", "min"), last=("done", "max"))
    return float((g["last"] - g["first"]).sum() / 1e9)


def lateness_ms(records: list[dict[str, Any]]) -> list[float]:
    """Each request's send time after its due time (ms; `due_ns`: its arrival, or in a closed loop the moment its
    user's previous request finished): the client's own delay, which no engine causes."""
    return [(r["send_ns"] - r["due_ns"]) / NS_PER_MS for r in records if r.get("due_ns") is not None]


def window_throughputs(records: list[dict[str, Any]], n: int = 6) -> list[float]:
    """Output tok/s in `n` equal windows from the first send to the last finish, tokens counted when they arrived:
    the spread inside one sustained level, for its interval. Their mean is the level's output throughput
    (the same tokens over the same wall time), so the interval is about the number the report shows."""
    if not records:
        return []
    t0, t1 = min(r["send_ns"] for r in records), max(r["done_ns"] for r in records)
    if t1 <= t0:
        return []
    width = (t1 - t0) / n
    counts = [0] * n
    for r in records:
        for t, k in r["events"]:
            if t0 <= t <= t1:
                counts[min(int((t - t0) / width), n - 1)] += k
    return [c / (width / 1e9) for c in counts]


def meets_slo(row: dict[str, Any], slo: dict[str, float | None]) -> bool:
    for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
        limit = slo.get(key)
        if limit is not None:
            v = row[key]
            if key == "tpot_ms" and v != v:  # a 1-token request has no TPOT; it cannot violate it
                continue
            if not (v == v and v <= limit):
                return False
    return True


def summarize(records: list[dict[str, Any]], slo: dict[str, float | None] | None = None,
              retokenize: Callable[[str], int] | None = None) -> dict[str, Any]:
    """The metric groups of one (engine, load level) from its finished records."""
    slo = slo or {}
    if not records:
        return {"num_requests": 0}
    rows = [per_request(r) for r in records]
    df = pd.DataFrame(rows)
    dur = wall_seconds(records)
    out_tok, in_tok = int(df["output_tokens"].sum()), int(df["prompt_tokens"].sum())
    good = sum(meets_slo(r, slo) for r in rows) if any(v is not None for v in slo.values()) else None
    s: dict[str, Any] = {
        "num_requests": len(records),
        "duration_s": dur,
        "prompt_tokens": in_tok,
        "output_tokens": out_tok,
        "output_throughput": out_tok / dur if dur > 0 else None,
        "total_throughput": (out_tok + in_tok) / dur if dur > 0 else None,
        "request_throughput": len(records) / dur if dur > 0 else None,
        "goodput": (good / dur if dur > 0 else None) if good is not None else None,
        "slo_met": good,
        "ttft_ms": stats(df["ttft_ms"]),
        "tpot_ms": stats(df["tpot_ms"]),
        "itl_ms": stats(v for lst in df["itl_ms"] for v in lst),
        "e2el_ms": stats(df["e2el_ms"]),
    }
    s["token_checks"] = token_checks(records, retokenize)
    return s


def token_checks(records: list[dict[str, Any]], retokenize: Callable[[str], int] | None) -> dict[str, Any]:
    """Counts come from returned ids; these are the cross-checks whose mismatches the report shows."""
    reported = [r for r in records if r.get("completion_tokens_reported") is not None]
    c: dict[str, Any] = {
        "reported_count_mismatch": sum(r["completion_tokens_reported"] != len(r["output_token_ids"]) for r in reported),
        "prompt_count_mismatch": sum(r.get("prompt_tokens_reported") not in (None, len(r["prompt_token_ids"]))
                                     for r in records),
        "stopped_early": sum(len(r["output_token_ids"]) < r["output_len"] for r in records),
        "retokenized_mismatch": None,
    }
    # a request that ended at EOS / a stop id / a stop string has that stop's text cut from its text (as
    # vLLM does), so its text cannot re-tokenize to its ids: only the ones that ran to length are checked
    with_text = [r for r in records if r.get("text") and r.get("finish_reason") != "stop"]
    if retokenize is not None and with_text:  # engines that stream no text have nothing to re-tokenize
        c["retokenized_mismatch"] = sum(retokenize(r["text"]) != len(r["output_token_ids"]) for r in with_text)
    return c


def agreement(base: dict[str, list[int]], other: dict[str, list[int]]) -> dict[str, Any]:
    """Greedy-token agreement of `other` against `base` over the requests both finished:
    the share of requests with identical outputs, and the mean share of each output that
    matches before the first differing token."""
    common = sorted(set(base) & set(other))
    if not common:
        return {"requests": 0, "exact": None, "prefix": None}
    exact, prefix = 0, 0.0
    for k in common:
        a, b = base[k], other[k]
        exact += a == b
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        prefix += n / max(len(a), len(b), 1)
    return {"requests": len(common), "exact": exact / len(common), "prefix": prefix / len(common)}


def mean_decoding(records: list[dict[str, Any]]) -> float | None:
    """Time-averaged number of requests between their first and their last token, over the
    time at least one was (the client's view of the decode batch size)."""
    spans = [(r["events"][0][0], r["events"][-1][0]) for r in records if len(r["events"]) >= 2]
    if not spans:
        return None
    busy = sum(b - a for a, b in spans)
    covered, end = 0, None
    for a, b in sorted(spans):  # length of the union of the spans
        if end is None or a > end:
            covered += b - a
            end = b
        elif b > end:
            covered += b - end
            end = b
    return busy / covered if covered > 0 else None
