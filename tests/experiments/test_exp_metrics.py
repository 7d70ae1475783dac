"""Metric definitions on hand-made records (docs/architecture.md's definitions, exactly)."""
from __future__ import annotations

import math

import pytest

from experiments.measuring import metrics

MS = 1_000_000


def rec(rid="r", send=0, events=((10, 1), (12, 1), (18, 3), (20, 1)), out=None, session=0, **kw):
    ev = [[t * MS, n] for t, n in events]
    n_out = sum(n for _, n in events)
    return {"request_id": rid, "send_ns": send * MS, "events": ev, "done_ns": ev[-1][0] if ev else send * MS,
            "output_token_ids": out if out is not None else list(range(n_out)), "prompt_token_ids": [1, 2, 3],
            "output_len": n_out, "session": session, "text": "", **kw}


def test_per_request_definitions():
    row = metrics.per_request(rec())
    assert row["ttft_ms"] == 10 and row["e2el_ms"] == 20 and row["output_tokens"] == 6
    assert row["tpot_ms"] == pytest.approx((20 - 10) / 5)
    # the 3-token event after a 6 ms gap contributes three 2 ms values
    assert row["itl_ms"] == pytest.approx([2, 2, 2, 2, 2])
    one = metrics.per_request(rec(events=((7, 1),)))
    assert one["ttft_ms"] == 7 and math.isnan(one["tpot_ms"]) and one["itl_ms"] == []


def test_summary_throughput_goodput_and_sessions():
    recs = [rec("a", send=0), rec("b", send=5, events=((100, 6),)), rec("c", send=1000, session=1,
                                                                         events=((1010, 1), (1030, 5)))]
    s = metrics.summarize(recs, {"ttft_ms": 50})
    # wall time per session: (100 - 0) + (1030 - 1000) ms; the gap between sessions is not counted
    assert s["duration_s"] == pytest.approx(0.13)
    assert s["output_tokens"] == 18 and s["output_throughput"] == pytest.approx(18 / 0.13)
    assert s["total_throughput"] == pytest.approx((18 + 9) / 0.13)
    assert s["slo_met"] == 2 and s["goodput"] == pytest.approx(2 / 0.13)  # b's TTFT is 95 ms
    assert s["ttft_ms"]["median"] == 10 and s["ttft_ms"]["mean"] == pytest.approx(115 / 3)
    assert metrics.summarize(recs, {})["goodput"] is None


def test_token_checks():
    recs = [rec("a", completion_tokens_reported=6, prompt_tokens_reported=3),
            rec("b", completion_tokens_reported=5, prompt_tokens_reported=4),
            {**rec("c"), "output_len": 10}]
    c = metrics.token_checks(recs, None)
    assert c == {"reported_count_mismatch": 1, "prompt_count_mismatch": 1, "stopped_early": 1,
                 "retokenized_mismatch": None}
    recs[0]["text"] = "six words in this one here"
    assert metrics.token_checks(recs, lambda t: len(t.split()))["retokenized_mismatch"] == 0


def test_agreement():
    base = {"a": [1, 2, 3, 4], "b": [5, 6], "only-base": [1]}
    other = {"a": [1, 2, 9, 4], "b": [5, 6]}
    a = metrics.agreement(base, other)
    assert a["requests"] == 2 and a["exact"] == 0.5 and a["prefix"] == pytest.approx((0.5 + 1) / 2)
    assert metrics.agreement(base, {})["exact"] is None
