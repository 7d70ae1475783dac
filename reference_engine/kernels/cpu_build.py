"""What the project's C++ CPU kernels share: the vector helpers and the build.

`HEADER` is prepended to each kernel's source: includes, and under AVX2 + FMA `load8` / `store8`
(8 floats from fp32 or bf16 memory and back, bf16 rounded to nearest even), `reduce8` and `exp8`
(Cephes' expf for x <= 0). `load(name, source, functions)` builds with
`torch.utils.cpp_extension.load_inline` (a C++ compiler and OpenMP needed) and keeps the library in
$INFERLAB_CACHE/kernels (default ~/.cache/inferlab/kernels), keyed on everything it depends on:
Python's version and ABI, torch's version, the compiler's path and `--version`, the source and the
flags (`key_parts`). The module name carries the CPU's vector ISA, so a cache shared between
machines never loads code built for another instruction set. A cached library that fails to load
is reported in one warning line and rebuilt; a kernel that cannot be built is reported too
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

HEADER = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VEC8 1
static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const at::BFloat16* p) {  // bf16 -> fp32: the 16 bits are the high half
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
// fp32 -> bf16, round to nearest even (what at::BFloat16's constructor does for finite values)
static inline void store8(at::BFloat16* p, __m256 v) {
  __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  b = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}
static inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
// lane r of the result = the sum of the 8 lanes of a[r]
static inline __m256 reduce8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}
// e^x for x <= 0 (Cephes' expf: exp(x) = 2^n e^r, |r| <= ln2/2, degree-5 polynomial; ~1 ulp)
static inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

"""

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


def key_parts(source: str, functions: list[str], flags: list[str], cxx: str) -> dict[str, str]:
    """Everything the built library depends on: Python's version and ABI (the extension's C API),
    torch's version (its C++ ABI), the compiler (path and `--version`), the source, the exported
    functions and the flags."""
    return {"python": sys.version, "abi": sysconfig.get_config_var("SOABI") or sys.implementation.cache_tag,
            "torch": f"{torch.__version__} {torch.version.git_version}", "compiler": cxx,
            "compiler_version": compiler_version(cxx), "source": hashlib.sha256(source.encode()).hexdigest(),
            "functions": ",".join(functions), "flags": " ".join(flags)}


def build_dir(module_name: str, parts: dict[str, str]) -> Path:
    """The cache entry for these key parts: `<dir>.so` is the kept library, `<dir>/` torch's build."""
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
    return _kernel_cache() / f"{module_name}-{key}"


def load(name: str, source: str, functions: list[str]):
    """Build (or load from the disk cache) `source` as extension `<name>_<isa>` exporting `functions`.
    -ffp-contract=off: no fused multiply-adds the source did not write, so plain `a * b + c` rounds
    twice, as PyTorch's separate ops do (the rotary kernel relies on it to match them bit for bit)."""
    from torch.utils.cpp_extension import load_inline

    isa = torch.backends.cpu.get_cpu_capability()
    flags = ["-O3", "-fopenmp", "-ffp-contract=off", *ISA_FLAGS.get(isa, [])]
    module_name = f"{name}_{isa.lower()}"
    cxx = compiler()
    if cxx is None:
        raise RuntimeError(f"{module_name}: no C++ compiler (CXX={os.environ.get('CXX') or 'c++'} not found)")
    # torch's own build cache rebuilds whenever the venv's path changes (its include paths are in
    # the ninja command): every fresh clone paid ~1 min of CPU. Keep a copy of the library under a key
    # of what it depends on (key_parts), so that a copy built for another Python, torch or compiler
    # is never loaded.
    where = build_dir(module_name, key_parts(source, functions, flags, cxx))
    kept = where.with_suffix(".so")
    if kept.is_file():
        try:
            return _import(module_name, kept)
        except Exception as e:  # truncated, corrupted, built elsewhere: say so and rebuild it
            log.warning("C++ kernel %s: the cached build %s does not load (%s); rebuilding it",
                        module_name, kept, _first_line(e))
    where.mkdir(parents=True, exist_ok=True)
    module = load_inline(name=module_name, cpp_sources=[source], functions=functions, extra_cflags=flags,
                         extra_ldflags=["-fopenmp"], build_directory=str(where), verbose=False)
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
