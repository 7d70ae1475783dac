"""Models for the speculation tests: a tiny Llama whose greedy output walks 8-token cycles
(n-gram speculation then proposes what the model will say) and a one-layer draft of it."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cyclic_llama(tmp_path_factory) -> Path:
    from reference_engine.model.make import make_model

    return make_model(tmp_path_factory.mktemp("cyclic"), preset="tiny", family="llama", seed=0, cycle=8)


@pytest.fixture(scope="session")
def cyclic_draft(cyclic_llama, tmp_path_factory) -> Path:
    from reference_engine.model.make import truncate

    return truncate(cyclic_llama, tmp_path_factory.mktemp("cyclic-draft") / "draft", layers=1, force=True)
