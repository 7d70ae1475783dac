"""Session-wide fixtures: tiny random-weight models, made once per test session."""
from __future__ import annotations

import pytest

from reference_engine.make_model import make_model


@pytest.fixture(scope="session")
def make_tiny(tmp_path_factory):
    """make_tiny(family="llama", seed=0, **config_overrides) -> Path, cached by its arguments."""
    cache: dict = {}

    def make(family: str = "llama", seed: int = 0, **overrides):
        key = (family, seed, repr(sorted(overrides.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"tiny-{family}-{seed}")
            cache[key] = make_model(out, preset="tiny", family=family, seed=seed,
                                    config_overrides=overrides or None, force=True)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(make_tiny):
    return make_tiny("llama")


@pytest.fixture(scope="session")
def tiny_qwen2(make_tiny):
    return make_tiny("qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3(make_tiny):
    return make_tiny("qwen3")
