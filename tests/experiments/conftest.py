"""Fixtures for the harness tests: a tiny model made once per session, the paced fixture
engine registered under test-only names (configs: exp_util.write_config)."""
from __future__ import annotations

from pathlib import Path

import pytest

from adapters import registry


@pytest.fixture(scope="session")
def exp_model(tmp_path_factory) -> Path:
    from reference_engine.model.make import make_model

    d = tmp_path_factory.mktemp("models") / "tiny-llama"
    make_model(d, preset="tiny", family="llama", seed=0)
    return d


@pytest.fixture
def paced(monkeypatch) -> list[str]:
    """Registers the paced engine as 'paced' and 'paced2' (two names, same fixture engine)."""
    for name in ("paced", "paced2"):
        monkeypatch.setitem(registry.ADAPTERS, name, "tests.experiments.paced_engine:PacedEngine")
    return ["paced", "paced2"]



@pytest.fixture
def simulated(monkeypatch) -> list[str]:
    """The same names ('paced', 'paced2', and 'sim') on the simulated engine, run on simulated
    time (experiments.clock.simulated): the planted delays come out exactly, on any machine."""
    from experiments import clock

    for name in ("paced", "paced2", "sim"):
        monkeypatch.setitem(registry.ADAPTERS, name, "tests.experiments.sim_engine:SimEngine")
    with clock.simulated():
        yield ["paced", "paced2"]
