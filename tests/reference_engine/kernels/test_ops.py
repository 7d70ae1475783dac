"""kernels/ops.py is the kernels' one Python surface: a wrapper for each entry point kernels.h declares and
bindings.cpp exports, no other, and no other module that reaches into the extension itself."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

from reference_engine.kernels import ops

ROOT = Path(__file__).resolve().parents[3]
CSRC = ROOT / "reference_engine" / "kernels" / "csrc"
HELPERS = {"available"}  # ops' own functions that wrap no entry point


def declared(header: str) -> set[str]:
    """The functions a header declares (a return type, a name, an open parenthesis, at the line's start)."""
    return set(re.findall(r"^(?:[\w:]+(?:<[\w:]+>)?)\s+(\w+)\(", header, re.M))


def exported(bindings: str) -> set[str]:
    return set(re.findall(r'm\.def\("(\w+)"', bindings))


def wrappers() -> set[str]:
    return {n for n, f in inspect.getmembers(ops, inspect.isfunction)
            if f.__module__ == ops.__name__ and not n.startswith("_")} - HELPERS


def reaching_past_ops(root: Path) -> list[str]:
    """Modules under reference_engine/ that call the extension itself (cpu_build.module) rather than ops."""
    own = {Path("reference_engine/kernels/ops.py"), Path("reference_engine/kernels/cpu_build.py")}
    return [str(p.relative_to(root)) for p in sorted((root / "reference_engine").rglob("*.py"))
            if p.relative_to(root) not in own and re.search(r"\bcpu_build\.module\b|\bmodule\(\)\.", p.read_text())]


def test_every_entry_point_has_one_wrapper_and_every_wrapper_an_entry_point():
    entry = declared((CSRC / "kernels.h").read_text())
    assert entry == exported((CSRC / "bindings.cpp").read_text()) == wrappers()
    assert all(ops.__dict__[n].__doc__ for n in entry)  # each says its shapes and what it computes


def test_the_parsers_see_a_planted_entry_point():
    assert declared("at::Tensor twice(at::Tensor x);\nvoid y(int a,\n       int b);\n") == {"twice", "y"}
    assert exported('  m.def("twice", &twice, "2 x");') == {"twice"}


def test_only_ops_calls_the_extension(tmp_path):
    assert reaching_past_ops(ROOT) == []
    planted = tmp_path / "reference_engine" / "model" / "fast.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from reference_engine.kernels import cpu_build\ncpu_build.module().linear(x, p, 3, b)\n")
    assert reaching_past_ops(tmp_path) == ["reference_engine/model/fast.py"]
