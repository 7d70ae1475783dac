"""What the project's C++ CPU kernels share: the vector helpers and the build.

`HEADER` is prepended to each kernel's source: includes, and under AVX2 + FMA `load8` / `store8`
(8 floats from fp32 or bf16 memory and back, bf16 rounded to nearest even), `reduce8` and `exp8`
(Cephes' expf for x <= 0). `load(name, source, functions)` builds with
`torch.utils.cpp_extension.load_inline` (a C++ compiler and OpenMP needed; cached on disk under
TORCH_EXTENSIONS_DIR). The module name carries the CPU's vector ISA, so a cache shared between
machines never loads code built for another instruction set.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
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


def compiler_available() -> bool:
    return shutil.which("c++") is not None or shutil.which("g++") is not None


def builds(module) -> bool:
    """Does `module()` (a kernel's cached builder) build and load here? False without a C++ compiler,
    headers or OpenMP: the PyTorch code serves instead."""
    if not compiler_available():
        return False
    try:
        module()
    except Exception:
        return False
    return True


def load(name: str, source: str, functions: list[str]):
    """Build (or load from the disk cache) `source` as extension `<name>_<isa>` exporting `functions`.
    -ffp-contract=off: no fused multiply-adds the source did not write, so plain `a * b + c` rounds
    twice, as PyTorch's separate ops do (the rotary kernel relies on it to match them bit for bit)."""
    from torch.utils.cpp_extension import load_inline

    isa = torch.backends.cpu.get_cpu_capability()
    flags = ["-O3", "-fopenmp", "-ffp-contract=off", *ISA_FLAGS.get(isa, [])]
    module_name = f"{name}_{isa.lower()}"
    # torch's own build cache rebuilds whenever the venv's path changes (its include paths are in
    # the ninja command): every fresh clone paid ~1 min of CPU. The built library depends only on
    # the source, the flags, the ISA and torch's version, so keep a copy under that key.
    key = hashlib.sha256("\0".join([source, *functions, *flags, torch.__version__]).encode()).hexdigest()[:16]
    kept = _kernel_cache() / f"{module_name}-{key}.so"
    if kept.is_file():
        spec = importlib.util.spec_from_file_location(module_name, kept)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    module = load_inline(name=module_name, cpp_sources=[source], functions=functions,
                         extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_suffix(f".{os.getpid()}.tmp")
        shutil.copy2(module.__file__, tmp)
        os.replace(tmp, kept)  # atomic: a concurrent builder never loads half a file
    except OSError:  # a read-only cache only costs the next process a rebuild
        pass
    return module


def _kernel_cache() -> Path:
    root = os.environ.get("INFERLAB_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                            os.path.expanduser("~/.cache"), "inferlab")
    return Path(root) / "kernels"
