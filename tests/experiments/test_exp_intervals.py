"""Interval arithmetic and the winner rule: a winner only where the intervals do not overlap."""
from __future__ import annotations

import numpy as np
import pytest

from experiments.commands.run import interleaved
from experiments.measuring import intervals


def test_median_ci_over_repeats():
    med, lo, hi = intervals.median_ci([10.0, 12.0, 11.0])
    assert med == 11.0 and lo >= 10.0 and hi <= 12.0 and lo < med < hi
    assert intervals.median_ci([5.0]) == (5.0, 5.0, 5.0)  # one value: no spread to show
    assert intervals.median_ci([None, float("nan")]) is None
    # many tight repeats: the interval is narrow around the median
    rng = np.random.default_rng(1)
    med, lo, hi = intervals.median_ci(100 + rng.normal(0, 1, 41))
    assert hi - lo < 1.5 and lo < med < hi


def test_request_bootstrap_covers_the_statistic():
    rng = np.random.default_rng(2)
    groups = [rng.normal(50, 5, 10) for _ in range(40)]
    lo, hi = intervals.request_ci(groups, np.mean)
    assert lo < np.mean(np.concatenate(groups)) < hi and hi - lo < 5
    assert intervals.request_ci([np.array([1.0])], np.mean) is None  # one request: no interval


def test_merge_takes_medians_and_records_intervals():
    ci: dict = {}
    s = intervals.merge([{"a": 1.0, "b": {"c": 10}, "t": "x", "flag": True},
                         {"a": 3.0, "b": {"c": 30}, "t": "y", "flag": False},
                         {"a": 2.0, "b": {"c": 20}, "t": "z", "flag": True}], ci)
    assert s == {"a": 2.0, "b": {"c": 20.0}, "t": "x", "flag": True}
    assert set(ci) == {"a", "b.c"} and ci["a"][0] >= 1.0 and ci["a"][1] <= 3.0
    assert intervals.get(s, "b.c") == 20.0 and intervals.get(s, "b.missing") is None


def test_winner_only_where_intervals_do_not_overlap():
    w = intervals.winner({"vllm": (500, 480, 520), "ref": (300, 290, 310), "hf": (200, 150, 250)}, True)
    assert w == {"winner": "vllm", "beats": ["ref", "hf"], "ties": []}
    # lower is better (latency)
    w = intervals.winner({"vllm": (30, 28, 33), "ref": (20, 18, 22)}, False)
    assert w["winner"] == "ref" and w["beats"] == ["vllm"]


def test_no_winner_when_intervals_overlap():
    w = intervals.winner({"vllm": (500, 400, 600), "ref": (480, 450, 590)}, True)
    assert w == {"winner": None, "beats": [], "ties": ["ref"]}
    # the best beats one engine but overlaps another: named winner over that one only
    w = intervals.winner({"a": (10, 9, 11), "b": (10.5, 10.2, 12), "c": (20, 19, 21)}, False)
    assert w == {"winner": "a", "beats": ["c"], "ties": ["b"]}
    assert intervals.winner({"a": (1, 0, 2)}, True)["winner"] is None  # one engine: nothing to rank


def test_engines_are_interleaved():
    assert interleaved(["ref", "vllm"], 3) == [("ref", 1), ("vllm", 1), ("ref", 2), ("vllm", 2), ("ref", 3),
                                               ("vllm", 3)]
    assert interleaved(["a"], 1) == [("a", 1)]


@pytest.mark.parametrize("rate, passed, lo, hi, want", [
    (1.0, True, None, None, (2.0, 1.0, None)),  # bracketing up
    (4.0, False, 2.0, None, (3.0, 2.0, 4.0)),  # bracket found: bisect
    (1.0, False, None, None, (0.5, None, 1.0)),  # the start failed: halve
    (3.0, True, 2.0, 4.0, (3.5, 3.0, 4.0)),
])
def test_search_brackets_then_bisects(rate, passed, lo, hi, want):
    from experiments.running.search import next_rate

    assert next_rate(rate, passed, lo, hi) == want
