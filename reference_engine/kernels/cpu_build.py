"""The build of the project's C++ CPU kernels: one extension from the files in `csrc/`.

The sources are C++ files (csrc/*.cpp, *.h): `common.h` holds what every kernel shares, each once (the
work-sharing loop `share`, the profiler region `PROFILE`), `simd.h` the vector lanes (the 8- and 16-lane
helpers `load8` / `store8` / `exp8` ..., the bf16 rounding `round_bf16`, `Vec<W>`, the bf16 pair step),
`amx.h` the AMX tile configuration; `kernels.h` declares each kernel's entry point; `bindings.cpp` exposes
them to Python and `ops.py` wraps each. `module()` builds them all into one extension
(`torch.utils.cpp_extension.load` with `sources=`, -Wall -Wextra, one object per file, a C++ compiler
and OpenMP needed) and keeps the library in $INFERLAB_CACHE/kernels (default ~/.cache/inferlab/kernels),
keyed on everything it depends on: Python's version and ABI, torch's version, the compiler's path and
`--version`, every source file's content and the flags (`key_parts`). The flags and the module name
carry the vector ISA torch dispatches to (`torch.backends.cpu.get_cpu_capability()`, which honours
ATEN_CPU_CAPABILITY=avx2|default): AVX-512, AVX2 + FMA or none (the scalar code), so a cache shared
between machines never loads code built for another instruction set. A cached library that fails to
load is reported in one warning line and rebuilt; a kernel that cannot be built is reported too
(`builds`), never skipped silently, unless there is no compiler at all.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch

CSRC = Path(__file__).parent / "csrc"
# -ffp-contract=off: no fused multiply-adds the source did not write, so plain `a * b + c` rounds twice,
# as PyTorch's separate ops do (the rotary kernel relies on it to match them bit for bit)
FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-Wall", "-Wextra"]
ISA_FLAGS = {"AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
             "AVX2": ["-mavx2", "-mfma"]}

log = logging.getLogger(__name__)


def compiler() -> str | None:
    """The C++ compiler torch's build runs ($CXX, else c++), resolved on PATH; None where there is none."""
    return shutil.which(os.environ.get("CXX") or "c++")


def compiler_available() -> bool:
    return compiler() is not None


@functools.cache
def compiler_version(path: str) -> str:
    """`path --version` (its first lines name the compiler and its release)."""
    try:
        run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"
    return (run.stdout or run.stderr).strip()


def builds(module) -> bool:
    """Does `module()` (a kernel's cached builder) build and load here? False without a C++ compiler
    (the documented fallback: the PyTorch code serves instead); a build or load that fails with a
    compiler present says so in one warning line, naming the kernel and the error."""
    if compiler() is None:
        return False
    try:
        module()
    except Exception as e:
        log.warning("C++ kernel %s does not build or load here, the PyTorch code serves instead: %s",
                    module.__module__, _first_line(e))
        return False
    return True


def sources(where: Path = CSRC) -> list[Path]:
    """The files one build compiles (*.cpp) and every file it reads (*.h too), sorted."""
    return sorted(p for p in where.iterdir() if p.suffix in (".cpp", ".h"))


def key_parts(files: list[Path], flags: list[str], cxx: str) -> dict[str, str]:
    """Everything the built library depends on: Python's version and ABI (the extension's C API),
    torch's version (its C++ ABI), the compiler (path and `--version`), every source file's name and
    content, and the flags."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return {"python": sys.version, "abi": sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag,
            "torch": f"{torch.__version__} {torch.version.git_version}", "compiler": cxx,
            "compiler_version": compiler_version(cxx), "source": digest.hexdigest(), "flags": " ".join(flags)}


def build_dir(module_name: str, parts: dict[str, str]) -> Path:
    """The cache entry for these key parts: `<dir>.so` is the kept library, `<dir>/` torch's build."""
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return _kernel_cache() / f"{module_name}-{key}"


def isa() -> str:
    """The vector ISA the kernels are built for: torch's CPU capability ("AVX512", "AVX2", "DEFAULT")."""
    return torch.backends.cpu.get_cpu_capability()


def flags(isa_: str | None = None) -> list[str]:
    return [*FLAGS, *ISA_FLAGS.get(isa_ or isa(), [])]


def module():
    """The kernels' extension for this ISA (built once per process; the build itself is cached on disk).
    A build that failed raises the same error again at once: every call asks, one compile is tried."""
    built, error = _module()
    if error is not None:
        raise error
    return built


@functools.cache
def _module():
    try:
        return load("inferlab_cpu", sources()), None
    except Exception as e:
        return None, e


def load(name: str, files: list[Path], isa_: str | None = None):
    """Build (or load from the disk cache) the .cpp files among `files` as extension `<name>_<isa>`
    (the .h files are read through #include: they are part of the key). `isa_` builds for another ISA
    than torch's (an A/B of two builds in one process); the CPU must run it."""
    from torch.utils.cpp_extension import load as build

    isa_ = isa_ or isa()
    cflags = flags(isa_)
    module_name = f"{name}_{isa_.lower()}"
    cxx = compiler()
    if cxx is None:
        raise RuntimeError(f"{module_name}: no C++ compiler (CXX={os.environ.get('CXX') or 'c++'} not found)")
    # torch's own build cache rebuilds whenever the venv's path changes (its include paths are in
    # the ninja command): every fresh clone paid ~1 min of CPU. Keep a copy of the library under a key
    # of what it depends on (key_parts), so that a copy built for another Python, torch or compiler
    # is never loaded.
    where = build_dir(module_name, key_parts(files, cflags, cxx))
    kept = where.with_suffix(".so")
    if kept.is_file():
        try:
            return _import(module_name, kept)
        except Exception as e:  # truncated, corrupted, built elsewhere: say so and rebuild it
            log.warning("C++ kernel %s: the cached build %s does not load (%s); rebuilding it",
                        module_name, kept, _first_line(e))
    where.mkdir(parents=True, exist_ok=True)
    cpp = [str(f) for f in files if f.suffix == ".cpp"]
    module = build(name=module_name, sources=cpp, extra_cflags=cflags, extra_ldflags=["-fopenmp"],
                   extra_include_paths=sorted({str(Path(f).parent) for f in cpp}), build_directory=str(where),
                   verbose=False)
    try:
        tmp = kept.with_suffix(f".{os.getpid()}.tmp")
        shutil.copy2(module.__file__, tmp)
        os.replace(tmp, kept)  # atomic: a concurrent builder never loads half a file
    except OSError:  # a read-only cache only costs the next process a rebuild
        pass
    return module


def _import(module_name: str, path: Path):
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _kernel_cache() -> Path:
    root = os.environ.get("INFERLAB_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                            os.path.expanduser("~/.cache"), "inferlab")
    return Path(root) / "kernels"
