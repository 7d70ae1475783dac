"""Fixtures for the reference engine tests."""
from __future__ import annotations

import pytest

from tests.reference_engine.helpers import hf_greedy


@pytest.fixture(scope="session")
def hf_reference():
    cache: dict = {}

    def get(model_dir, prompts, max_new_tokens):
        key = (str(model_dir), tuple(map(tuple, prompts)), max_new_tokens)
        if key not in cache:
            cache[key] = hf_greedy(str(model_dir), prompts, max_new_tokens)
        return cache[key]

    return get
