"""Cumulative-to-delta diffing (SGLang's /generate stream, TensorRT-LLM's outputs)."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.transport.deltas import Cumulative, Incremental, NotCumulative


def test_cumulative_gives_only_the_new_part():
    d = Cumulative()
    assert d.feed([5], "a") == ([5], "a")
    assert d.feed([5, 6, 7], "abc") == ([6, 7], "bc")
    assert d.feed([5, 6, 7], "abc") == ([], "")  # a repeat (e.g. a final event with no new token)
    assert d.ids == [5, 6, 7]


def test_a_value_that_does_not_extend_the_previous_one_is_an_error():
    d = Cumulative()
    d.feed([1, 2])
    with pytest.raises(NotCumulative, match="incrementally"):
        d.feed([3])  # what an incremental server sends next
    d = Cumulative()
    d.feed([1, 2])
    with pytest.raises(NotCumulative):
        d.feed([1, 9, 9])  # same length or longer, but a changed token


def test_text_that_stops_being_a_prefix_is_passed_whole():
    # a trailing replacement character is replaced once the multi-byte character completes
    d = Cumulative()
    d.feed([1], "ab\ufffd")
    assert d.feed([1, 2], "abé") == ([2], "abé")


def test_incremental_passes_through_and_keeps_the_total():
    d = Incremental()
    assert d.feed([4], "x") == ([4], "x")
    assert d.feed([4], "x") == ([4], "x")  # a repeated token is a new token here
    assert d.ids == [4, 4]


@given(st.lists(st.lists(st.integers(0, 50), max_size=4), max_size=12))
def test_deltas_concatenate_to_the_last_cumulative_value(chunks):
    d, total, got = Cumulative(), [], []
    for c in chunks:
        total = total + c
        got += d.feed(list(total))[0]
    assert got == total
