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


def plant(monkeypatch, name: str, cls: type) -> None:
    """Register `cls` as engine `name` for one test (an in-process engine with a spec of defaults)."""
    entry = registry.Entry(registry.EngineSpec(name, default_mode="in_process"), {"in_process": cls})
    monkeypatch.setitem(registry.entries(), name, entry)


@pytest.fixture
def paced(monkeypatch) -> list[str]:
    """Registers the paced engine as 'paced' and 'paced2' (two names, same fixture engine)."""
    from tests.experiments.paced_engine import PacedEngine

    for name in ("paced", "paced2"):
        plant(monkeypatch, name, PacedEngine)
    return ["paced", "paced2"]


@pytest.fixture
def simulated(monkeypatch) -> list[str]:
    """The same names ('paced', 'paced2', and 'sim') on the simulated engine, run on simulated
    time (experiments.running.clock.simulated): the planted delays come out exactly, on any machine."""
    from experiments.running import clock
    from tests.experiments.sim_engine import SimEngine

    for name in ("paced", "paced2", "sim"):
        plant(monkeypatch, name, SimEngine)
    with clock.simulated():
        yield ["paced", "paced2"]
