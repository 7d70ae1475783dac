"""The shipped configs: each engine's config is the reference config with one `engine = ...`
line and that engine's own knob block changed, and every shipped config validates."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from adapters import registry
from experiments.workload.config import load

CONFIGS = Path(__file__).resolve().parents[2] / "experiments" / "configs"
COMPARE = sorted(CONFIGS.glob("compare_*.toml"))


def _rest(path: Path) -> tuple[str, dict, dict]:
    raw = tomllib.loads(path.read_text())
    engine = raw.pop("engine")
    knobs = raw.pop("engine_options", {})
    return engine, knobs, raw


def test_one_compare_config_per_engine():
    engines = {_rest(p)[0] for p in COMPARE}
    assert engines >= {"reference", "vllm", "sglang", "trtllm", "tgi"}
    assert engines <= set(registry.names())


@pytest.mark.parametrize("path", COMPARE, ids=lambda p: p.stem)
def test_compare_configs_differ_only_by_engine_and_its_knobs(path):
    engine, knobs, rest = _rest(path)
    _, _, reference = _rest(CONFIGS / "compare_reference.toml")
    if engine in ("trtllm", "tgi"):  # their kernels run no float32: bfloat16, and the report flags the dtype
        assert rest.pop("dtype") == "bfloat16"
        reference.pop("dtype")
    assert rest == reference
    assert set(knobs) <= {engine}  # only this engine's own block
    assert path.stem == f"compare_{engine}"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_configs_validate(path, tmp_path, monkeypatch):
    raw = tomllib.loads(path.read_text())
    if "make_model" not in raw:  # a config that names an existing model dir only: point it at a stand-in
        (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)  # relative model paths resolve here; make_model lets a missing one pass
    (tmp_path / Path(raw["model"]).parent).mkdir(parents=True, exist_ok=True)
    (tmp_path / raw["model"]).mkdir(exist_ok=True)
    cfg = load(path)
    assert cfg.name == raw["name"]
