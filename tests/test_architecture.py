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
            "reference_engine/worker/memory_plan.py": "", "reference_engine/engine/messages.py": "",
            **{f"reference_engine/engine/{m}.py": "" for m in ("client", "async_engine", "engine_process", "engine_core",
                                                               "llm_engine", "step_log")},
            "adapters/__init__.py": "", "adapters/base.py": "", "adapters/registry.py": "",
            "adapters/engines/__init__.py": "", "adapters/engines/reference/__init__.py": "",
            "adapters/engines/reference/adapter.py": "from reference_engine import AsyncEngine\n",
            "adapters/engines/vllm/__init__.py": "from adapters.engines.vllm.adapter import VLLMServer\n",
            "adapters/engines/vllm/adapter.py": "from adapters.transport.server import LaunchedServer\n",
            "adapters/transport/server.py": "class LaunchedServer: ...\n",
            "experiments/__init__.py": "", "experiments/cli.py": "",
            "experiments/commands/run.py": "def _fail(): ...\n",
            "experiments/running/runner.py": "from adapters import registry\n"
                                             "SPEC = registry.spec('x')  # a name from the config, never one written here\n"}
    for path, src in {**base, **files}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(src)
    return root


def test_the_planted_tree_is_clean_without_a_violation(tmp_path):
    assert violations(plant(tmp_path, {})) == []
    # a front end that names the core's entry point, and the core's use of the runner's public interface, are allowed
    assert violations(plant(tmp_path, {
        "reference_engine/engine/engine_process.py": "from reference_engine.engine.engine_core import core_main\n"
                                                     "from reference_engine.engine.messages import Call\n",
        "reference_engine/engine/llm_engine.py": "from reference_engine.worker.model_runner import ModelRunner\n"})) == []


@pytest.mark.parametrize("files, expected", [
    ({"reference_engine/engine/llm_engine.py": "def f():\n    from experiments.commands import run\n"},
     "reference_engine.engine.llm_engine imports experiments.commands.run: the engine never imports adapters or the harness"),
    ({"reference_engine/engine/llm_engine.py": "import adapters.base\n"},
     "reference_engine.engine.llm_engine imports adapters.base: the engine never imports adapters or the harness"),
    ({"adapters/engines/hf/adapter.py": "from experiments.commands.run import run_main\n"},
     "adapters.engines.hf.adapter imports experiments.commands.run: adapters never import the harness"),
    ({"adapters/transport/launch.py": 'ARGV = ["python", "-m", "experiments.cli", "serve"]\n'},
     "adapters.transport.launch launches 'experiments.cli': adapters never launch the harness's modules"),
    ({"adapters/transport/launch.py": 'CMD = "python -m experiments.cli serve"\n'},
     "adapters.transport.launch launches 'python -m experiments.cli serve': adapters never launch the harness's modules"),
    # experiments/ names no engine: neither by importing an engine folder nor by writing an engine's name
    ({"experiments/running/runner.py": "def base(names):\n    return 'reference' if 'reference' in names else names[0]\n"},
     "experiments.running.runner names engine 'reference': the harness names no engine"),
    ({"experiments/report/plots.py": "COLOURS = {'vllm': 'tab:orange'}\n"},
     "experiments.report.plots names engine 'vllm': the harness names no engine"),
    ({"experiments/commands/dry_run.py": "from adapters.engines.vllm.adapter import VLLMServer\n"},
     "experiments.commands.dry_run imports adapters.engines.vllm.adapter: the harness names no engine"),
    # an engine folder imports no other engine's folder
    ({"adapters/engines/reference/server.py": "from adapters.engines.vllm.adapter import VLLMServer\n"},
     "adapters.engines.reference.server imports adapters.engines.vllm.adapter: an engine folder imports no other"),
    # nothing at the top of adapters/ or experiments/ but the interface, the registry and the CLI table
    ({"adapters/metric_names.py": "VLLM = {}\n"},
     "adapters/metric_names.py: no module at the top of adapters/ but __init__.py, base.py, registry.py"),
    ({"experiments/runner.py": "def run(): ...\n"},
     "experiments/runner.py: no module at the top of experiments/ but __init__.py, cli.py"),
    ({"adapters/engines/hf/adapter.py": "def weights():\n    from reference_engine.model.llama import param_bytes\n"},
     "adapters.engines.hf.adapter imports reference_engine.model.llama: adapters use only the engine's public API"),
    ({"reference_engine/model/llama.py": "from reference_engine.core.request import Request\n"},
     "reference_engine.model.llama imports reference_engine.core.request: model layers never import scheduling, KV or requests"),
    ({"reference_engine/attention/torch_backend.py": "def f():\n    import reference_engine.core.scheduler\n"},
     "reference_engine.attention.torch_backend imports reference_engine.core.scheduler: model layers never import"),
    ({"reference_engine/worker/model_runner.py": "from reference_engine.core.kv_cache_manager import KVCacheManager\n"},
     "reference_engine.worker.model_runner imports reference_engine.core.kv_cache_manager: the runner never imports"),
    ({"reference_engine/worker/input_batch.py": "from ..core import block_pool\n"},
     "reference_engine.worker.input_batch imports reference_engine.core.block_pool: the runner never imports"),
    ({"experiments/commands/check_observer.py": "def main():\n    from experiments.commands.run import _fail\n"},
     "experiments.commands.check_observer imports experiments.commands.run._fail: a private name of another module"),
    ({"reference_engine/config.py": "def f():\n    from reference_engine.model import fused_ops\n",
      "reference_engine/model/fused_ops.py": "from reference_engine.model.llama import RMSNorm\n",
      "reference_engine/model/llama.py": "from reference_engine.config import ModelConfig\n"},
     "import cycle: reference_engine.config -> reference_engine.model.fused_ops -> reference_engine.model.llama"),
    ({"experiments/report/__init__.py": "", "experiments/report/md.py": "def group():\n    from .rows import cell\n",
      "experiments/report/rows.py": "from experiments.report.md import fmt\n"},
     "import cycle: experiments.report.md -> experiments.report.rows"),
    # the engine's process boundary: front ends and the core share only engine/messages.py
    ({"reference_engine/engine/engine_core.py": "from reference_engine.engine.async_engine import AsyncEngine\n"},
     "reference_engine.engine.engine_core imports reference_engine.engine.async_engine: the core never imports a front end"),
    ({"reference_engine/engine/engine_process.py": "from reference_engine.engine.engine_core import Call, core_main\n"},
     "reference_engine.engine.engine_process imports reference_engine.engine.engine_core (Call, core_main): the front "
     "ends and the core share only engine/messages.py"),
    ({"reference_engine/engine/client.py": "def f():\n    from reference_engine.engine import llm_engine\n"},
     "reference_engine.engine.client imports reference_engine.engine.llm_engine (*): the front ends and the core share"),
    ({"reference_engine/engine/llm_engine.py": "from reference_engine.worker import memory_plan\n"},
     "reference_engine.engine.llm_engine imports reference_engine.worker.memory_plan: engine/ imports from worker/ only"),
    ({"reference_engine/engine/engine_core.py": "import types\nFACTS = types.SimpleNamespace(pid=1)\n"},
     "reference_engine.engine.engine_core uses types.SimpleNamespace: the engine passes typed messages"),
    ({"reference_engine/engine/step_log.py": "from types import SimpleNamespace\n"},
     "reference_engine.engine.step_log uses types.SimpleNamespace: the engine passes typed messages"),
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
