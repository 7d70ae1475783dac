"""One C++ call per decoder layer for an all-decode batch on CPU (fp32 or bf16) (reference_engine/model/fused_decode.py).

At batch 1 a SmolLM2 decode step spent ~5 ms of ~17-20 outside its 121 GEMVs: ~15 small ops per
layer (norms, split and views, rotary, the KV write, attention, residual adds, SiLU-and-multiply)
each paying Python, nn.Module and dispatcher overhead of a few microseconds, 30 layers deep. This
module runs the same layer as one call: the same kernels (kernels/cpp_fused_ops.py,
cpp_gemm.py, attention/cpp_kernel.py), in the same order, on the same tensors, so the result is
bit-identical to the module path (`DecoderLayer.forward` with the fused modules and the CPU attention
backend). `project` multiplies as PackedLinear does: the panel GEMM on each projection's one copy (fp32 panels or
bf16 pair panels), or on the INFERLAB_LINEAR=onednn fallback oneDNN's packed copy.

Source: csrc/decode_layer.cpp, which calls the other kernels through their entry points (csrc/kernels.h),
linked into the same extension; `decode_layer` is the only new code:

    h   = rms_norm(x, ln1)                                     (N, hidden)
    qkv = project(h, W_qkv) + b_qkv -> q (N, H, D), k, v (N, Hkv, D), views
    q, k = rope(q), rope(k)                                    in place, as FusedRotary
    k_cache[slots], v_cache[slots] = k, v
    x   = x + project(attention(q, caches, tables, lens), W_o)
    x   = x + project(silu_mul(project(rms_norm(x, ln2), W_gate_up)), W_down)
"""
from __future__ import annotations

from reference_engine.kernels import cpu_build


def module():
    """The kernels' extension (cpu_build.module: one build of csrc/, cached on disk)."""
    return cpu_build.module()
