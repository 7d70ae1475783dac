"""C++ CPU kernels for the decoder's element-wise stages, each one pass over memory.

PyTorch runs RMSNorm as six ops (cast, square, mean, add, rsqrt, two multiplies), rotary
embedding as eight (two rotations: slice, negate, cat, two multiplies, add) and SiLU-and-multiply
as three, each a separate pass with its own intermediate tensor and its own OpenMP fork. For a
decode batch those passes cost more than their arithmetic; fused, each stage reads its input once.

    rms_norm(x (N, H), w (H,), eps, out (N, H))      out = w * (x / sqrt(mean(x^2) + eps)) [HF's order]
    add_rms_norm(x, a, w, eps, sum, out)              sum = x + a (rounded to the dtype), out = rms_norm(sum)
    silu_mul(gu (N, 2I), out (N, I))                  out = silu(gu[:, :I]) * gu[:, I:]
    rope_(x (N, heads, D) strided rows, cos, sin (N, D))   in place: x * cos + rotate_half(x) * sin

fp32 or bf16 tensors (bf16 read as fp32, rounded back where HF rounds: after the normalisation and
after the weight multiply; each rotary product and the sum). Float32 results equal PyTorch's up to
the summation order of RMSNorm's mean and SiLU's exp (the rotary kernel is bit-identical: built
without contracted multiply-adds, see cpu_build.FLAGS). Rows are spread over torch's intra-op
threads only when there are enough of them (`at::parallel_for`'s grain), so a small decode batch
runs on the calling thread with no fork.

Source: csrc/fused_ops.cpp (the bf16 rounding is common.h's `round_bf16`).
"""
from __future__ import annotations

from reference_engine.kernels import cpu_build


def module():
    """The kernels' extension (cpu_build.module: one build of csrc/, cached on disk)."""
    return cpu_build.module()
