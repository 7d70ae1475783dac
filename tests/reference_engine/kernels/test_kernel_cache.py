"""kernels/cpu_build.py's disk cache: keyed on everything the library depends on, and a cached library
that does not load is said, in one line, and rebuilt; a kernel that does not build is said too. One
real compile of a one-line kernel (~5 s on 2 cores: it includes pybind11, not torch/extension.h), in a cache of the test's own (INFERLAB_CACHE)."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

from pathlib import Path

import pytest
import torch

from reference_engine.kernels import cpu_build

SOURCES = [Path(__file__).with_name("twice.cpp")]
NAME = "inferlab_test_twice"


def module():
    return cpu_build.load(NAME, SOURCES)


def entry() -> tuple[str, os.PathLike]:
    """(module name, kept library) of the test kernel, as `load` names them now."""
    name = f"{NAME}_{cpu_build.isa().lower()}"
    where = cpu_build.build_dir(name, cpu_build.key_parts(SOURCES, cpu_build.flags(), cpu_build.compiler()))
    return name, where.with_suffix(".so")


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == cpu_build.__name__ and r.levelno == logging.WARNING]


@pytest.mark.skipif(not cpu_build.compiler_available(), reason="needs a C++ compiler")
def test_every_part_of_the_key_changes_the_build_dir():
    cxx = cpu_build.compiler()
    parts = cpu_build.key_parts(SOURCES, ["-O3"], cxx)
    assert parts["python"] == sys.version and parts["torch"].startswith(torch.__version__)
    assert parts["compiler"] == cxx and parts["compiler_version"] == cpu_build.compiler_version(cxx) != ""
    assert set(parts) >= {"abi", "source", "flags"}
    where = cpu_build.build_dir(NAME, parts)
    assert cpu_build.build_dir(NAME, dict(parts)) == where
    for k in parts:
        assert cpu_build.build_dir(NAME, {**parts, k: parts[k] + " "}) != where, k


@pytest.mark.skipif(not (shutil.which("c++") and shutil.which("g++")), reason="needs c++ and g++")
def test_another_compiler_is_another_entry(monkeypatch):
    def parts():
        return cpu_build.key_parts(SOURCES, ["-O3"], cpu_build.compiler())

    monkeypatch.setenv("CXX", "c++")
    cxx = parts()
    monkeypatch.setenv("CXX", "g++")
    gxx = parts()
    assert cxx["compiler"] != gxx["compiler"]
    assert cpu_build.build_dir(NAME, cxx) != cpu_build.build_dir(NAME, gxx)


@pytest.mark.slow  # two compiles: ~9 s alone on 2 cores
@pytest.mark.skipif(not cpu_build.compiler_available(), reason="needs a C++ compiler")
def test_a_corrupted_cached_library_is_said_once_and_rebuilt(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path))
    assert module().twice(3) == 6  # the one compile
    name, kept = entry()
    assert kept.is_file() and kept.read_bytes()[:4] == b"\x7fELF"
    kept.write_bytes(b"not a shared library")
    caplog.set_level(logging.WARNING, logger=cpu_build.__name__)
    assert module().twice(4) == 8
    said = warnings(caplog)
    assert len(said) == 1 and name in said[0] and str(kept) in said[0] and "rebuilding" in said[0]
    assert "\n" not in said[0]
    assert kept.read_bytes()[:4] == b"\x7fELF"
    # a fresh process loads the rebuilt entry from the cache, without a word
    check = f"import torch; from {__name__} import module; print(module().twice(5))"
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                         env={**os.environ, "INFERLAB_CACHE": str(tmp_path)})
    assert run.returncode == 0 and run.stdout.strip() == "10" and "rebuilding" not in run.stderr, run.stderr


@pytest.mark.skipif(not os.path.exists("/bin/false"), reason="needs /bin/false")
def test_a_kernel_that_does_not_build_is_said_not_skipped_silently(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")  # a compiler that fails every build, at once
    caplog.set_level(logging.WARNING, logger=cpu_build.__name__)
    assert not cpu_build.builds(module)
    said = warnings(caplog)
    assert len(said) == 1 and __name__ in said[0] and "/bin/false" in said[0] and "\n" not in said[0]
    monkeypatch.setenv("CXX", "/nonexistent/c++")  # no compiler at all: the documented quiet fallback
    caplog.clear()
    assert not cpu_build.builds(module) and warnings(caplog) == []
