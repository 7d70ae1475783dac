"""The rules of docs/architecture.md hold in the repository, and each rule fires on a planted violation.

The checker (`tests/architecture.py`) reads the import graph with `ast`; the planted trees are a few
lines of Python written to tmp_path, so a rule that silently stopped matching would fail here.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.architecture import cycles, load, violations
from tests.docs import handbook as hb
from tests.docs.mermaid_check import check

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"


def test_the_repository_keeps_every_rule():
    assert violations(REPO) == []


def test_architecture_page_has_its_three_diagrams_and_its_links_resolve():
    diagrams = hb.fences(ARCHITECTURE, "mermaid")
    assert len(diagrams) == 3 and all(check(d) == [] for d in diagrams)
    assert diagrams[2].startswith("stateDiagram-v2") and "watchdog" in diagrams[2]  # the engine core's life
    assert "Scheduler.schedule" in diagrams[1] and "OutputProcessor" in diagrams[1]
    assert "adapters" in diagrams[0] and "experiment TOML" in diagrams[0]
    assert [p for h in hb.links(ARCHITECTURE) if (p := hb.resolve(ARCHITECTURE, h))] == []


def plant(root: Path, files: dict[str, str]) -> Path:
    """A tiny tree with the three packages, plus `files` (path -> source)."""
    base = {"reference_engine/__init__.py": "", "reference_engine/model/llama.py": "import torch\n",
            "reference_engine/core/__init__.py": "",
            "reference_engine/core/scheduler.py": "from reference_engine.core import kv_cache_manager\n",
            "reference_engine/core/kv_cache_manager.py": "from reference_engine.core.block_pool import BlockPool\n",
            "reference_engine/core/block_pool.py": "class BlockPool: ...\n",
            "reference_engine/core/request.py": "", "reference_engine/worker/model_runner.py": "from reference_engine import model\n",
            "adapters/__init__.py": "", "adapters/base.py": "", "adapters/reference.py":
            "from reference_engine import AsyncEngine\n",
            "experiments/__init__.py": "", "experiments/commands.py": "def _fail(): ...\n"}
    for path, src in {**base, **files}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(src)
    return root


def test_the_planted_tree_is_clean_without_a_violation(tmp_path):
    assert violations(plant(tmp_path, {})) == []


@pytest.mark.parametrize("files, expected", [
    ({"reference_engine/engine/llm_engine.py": "def f():\n    from experiments import commands\n"},
     "reference_engine.engine.llm_engine imports experiments.commands: the engine never imports adapters or the harness"),
    ({"reference_engine/engine/llm_engine.py": "import adapters.base\n"},
     "reference_engine.engine.llm_engine imports adapters.base: the engine never imports adapters or the harness"),
    ({"adapters/hf.py": "from experiments.commands import run_main\n"},
     "adapters.hf imports experiments.commands: adapters never import the harness"),
    ({"adapters/server.py": 'ARGV = ["python", "-m", "experiments.cli", "serve"]\n'},
     "adapters.server launches 'experiments.cli': adapters never launch the harness's modules"),
    ({"adapters/server.py": 'CMD = "python -m experiments.cli serve"\n'},
     "adapters.server launches 'python -m experiments.cli serve': adapters never launch the harness's modules"),
    ({"adapters/hf.py": "def weights():\n    from reference_engine.model.llama import param_bytes\n"},
     "adapters.hf imports reference_engine.model.llama: adapters use only the engine's public API"),
    ({"reference_engine/model/llama.py": "from reference_engine.core.request import Request\n"},
     "reference_engine.model.llama imports reference_engine.core.request: model layers never import scheduling, KV or requests"),
    ({"reference_engine/attention/torch_backend.py": "def f():\n    import reference_engine.core.scheduler\n"},
     "reference_engine.attention.torch_backend imports reference_engine.core.scheduler: model layers never import"),
    ({"reference_engine/worker/model_runner.py": "from reference_engine.core.kv_cache_manager import KVCacheManager\n"},
     "reference_engine.worker.model_runner imports reference_engine.core.kv_cache_manager: the runner never imports"),
    ({"reference_engine/worker/input_batch.py": "from ..core import block_pool\n"},
     "reference_engine.worker.input_batch imports reference_engine.core.block_pool: the runner never imports"),
    ({"experiments/check_observer.py": "def main():\n    from experiments.commands import _fail\n"},
     "experiments.check_observer imports experiments.commands._fail: a private name of another module"),
    ({"reference_engine/config.py": "def f():\n    from reference_engine.model import fused_ops\n",
      "reference_engine/model/fused_ops.py": "from reference_engine.model.llama import RMSNorm\n",
      "reference_engine/model/llama.py": "from reference_engine.config import ModelConfig\n"},
     "import cycle: reference_engine.config -> reference_engine.model.fused_ops -> reference_engine.model.llama"),
    ({"experiments/report/__init__.py": "", "experiments/report/md.py": "def group():\n    from .rows import cell\n",
      "experiments/report/rows.py": "from experiments.report.md import fmt\n"},
     "import cycle: experiments.report.md -> experiments.report.rows"),
    ({"scripts/long.py": "x = 1\n" * 401}, "scripts/long.py has 401 lines: no file over 400"),
])
def test_each_rule_fails_on_a_planted_violation(tmp_path, files, expected):
    found = violations(plant(tmp_path, files))
    assert len(found) == 1 and found[0].startswith(expected), found


def test_relative_imports_and_function_level_imports_are_edges(tmp_path):
    mods = load(plant(tmp_path, {"reference_engine/a.py": "def f():\n    from .b import x\n",
                                  "reference_engine/b.py": "from reference_engine import a\n"}))
    assert "reference_engine.b" in mods["reference_engine.a"].imports
    assert cycles(mods) == [["reference_engine.a", "reference_engine.b"]]
