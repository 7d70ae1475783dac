"""The uniform feature options (adapters.common.features): checked, completed with vLLM's defaults,
and compared with what an engine reports it runs."""
from __future__ import annotations

import pytest

from adapters.common.features import gaps, prefix_caching, speculative


def test_ngram_window_takes_vllms_defaults():
    """facts: vllm speculative_defaults (config/speculative.py @ 0.32.0): both 5; one sets the other."""
    assert speculative("x", {"method": "ngram", "num_speculative_tokens": 3}) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 5}
    assert speculative("x", {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4})[
        "prompt_lookup_min"] == 4
    assert speculative("x", {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2})[
        "prompt_lookup_max"] == 2
    assert speculative("x", {"num_speculative_tokens": 2, "model": "/d"}) == {
        "method": "draft_model", "num_speculative_tokens": 2, "model": "/d"}  # vLLM infers the method
    assert speculative("x", None) is None


@pytest.mark.parametrize("raw, match", [
    ({"method": "ngram"}, "num_speculative_tokens must be a positive integer"),
    ({"method": "ngram", "num_speculative_tokens": True}, "positive integer"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "positive integer"),
    ({"method": "eagle", "num_speculative_tokens": 2}, "method must be one of ngram, draft_model"),
    ({"method": "ngram", "num_speculative_tokens": 2, "k": 1}, "unknown key"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "min 4 >"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "/d"}, "model is for method draft_model"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "model .* is required"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "model": "/d", "prompt_lookup_max": 3}, "for method ngram"),
    ("ngram", "must be a table"),
])
def test_bad_speculative_config(raw, match):
    with pytest.raises(ValueError, match=match):
        speculative("eng", raw)


def test_prefix_caching_must_be_a_bool():
    assert prefix_caching("x", {}) is None and prefix_caching("x", {"enable_prefix_caching": False}) is False
    with pytest.raises(ValueError, match="true or false"):
        prefix_caching("x", {"enable_prefix_caching": "yes"})


def test_gaps_name_every_difference_and_every_silence():
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    asked = {"enable_prefix_caching": False, "speculative_config": ngram}
    assert gaps("e", asked, {"prefix_caching": False, "speculative": dict(ngram)}) == {}
    unknown = gaps("e", asked, {})
    assert "does not report whether prefix caching" in unknown["enable_prefix_caching"]
    assert "does not report its speculation" in unknown["speculative_config"]
    off = gaps("e", asked, {"prefix_caching": True, "speculative": False})
    assert "reports true" in off["enable_prefix_caching"] and "reports no speculation" in off["speculative_config"]
    other = gaps("e", asked, {"speculative": {**ngram, "num_speculative_tokens": 4}})
    assert "num_speculative_tokens 4 (asked 3)" in other["speculative_config"]
    assert gaps("e", {}, {"prefix_caching": True}) == {}  # nothing asked, nothing to say


def test_gaps_compare_draft_model_paths_resolved(tmp_path):
    draft = {"method": "draft_model", "num_speculative_tokens": 2, "model": str(tmp_path / "d")}
    same = {**draft, "model": str(tmp_path / "x" / ".." / "d")}
    assert gaps("e", {"speculative_config": draft}, {"speculative": same}) == {}
    assert "model" in gaps("e", {"speculative_config": draft}, {"speculative": {**draft, "model": "/other"}})[
        "speculative_config"]
