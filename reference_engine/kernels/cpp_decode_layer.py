"""One C++ call per decoder layer for an all-decode fp32 batch on CPU (reference_engine/model/fused_decode.py).

At batch 1 a SmolLM2 decode step spent ~5 ms of ~17-20 outside its 121 GEMVs: ~15 small ops per
layer (norms, split and views, rotary, the KV write, attention, residual adds, SiLU-and-multiply)
each paying Python, nn.Module and dispatcher overhead of a few microseconds, 30 layers deep. This
module runs the same layer as one call: the same kernels (kernels/cpp_fused_ops.py, cpp_gemv.py,
cpp_gemm.py, attention/cpp_kernel.py), in the same order, on the same tensors, so the result is
bit-identical to the module path (`DecoderLayer.forward` with the fused modules and the CPU attention
backend). `linear` picks what PackedLinear would: the GEMV up to SMALL_M rows, else the GEMM on the
panels (which `FusedDecode` passes only where PackedLinear holds them, and only for up to MID_M rows).

It is built from those kernels' own sources, each in a namespace of its own (their helpers share
names), their `#include`s hoisted out of it; `decode_layer` is the only new code:

    h   = rms_norm(x, ln1)                                     (N, hidden)
    qkv = linear(h, W_qkv) + b_qkv -> q (N, H, D), k, v (N, Hkv, D), views
    q, k = rope(q), rope(k)                                    in place, as FusedRotary
    k_cache[slots], v_cache[slots] = k, v
    x   = x + linear(attention(q, caches, tables, lens), W_o)
    x   = x + linear(silu_mul(linear(rms_norm(x, ln2), W_gate_up)), W_down)
"""
from __future__ import annotations

import functools

from reference_engine.attention import cpp_kernel as attention
from reference_engine.kernels import cpp_fused_ops as ops
from reference_engine.kernels import cpp_gemm as gemm
from reference_engine.kernels import cpp_gemv as gemv
from reference_engine.kernels import cpu_build


def _split(source: str) -> tuple[list[str], str]:
    """A kernel's source without the shared header: (its own #include lines, the rest)."""
    lines = source.removeprefix(cpu_build.HEADER).splitlines()
    return [ln for ln in lines if ln.startswith("#include")], "\n".join(ln for ln in lines if not ln.startswith("#include"))


def _compose() -> str:
    parts = {"ops_k": ops.SOURCE, "gemv_k": gemv.SOURCE, "gemm_k": gemm.SOURCE, "attn_k": attention.SOURCE}
    includes, bodies = [], []
    for ns, src in parts.items():
        inc, body = _split(src)
        includes += inc
        bodies.append(f"namespace {ns} {{\n{body}\n}}  // namespace {ns}\n")
    return cpu_build.HEADER + "\n".join(dict.fromkeys(includes)) + "\n" + "".join(bodies) + LAYER


LAYER = r"""
#include <ATen/core/dispatch/Dispatcher.h>

// oneDNN's packed linear through the dispatcher, as PackedLinear calls it from Python (bf16 weights on
// a CPU with native bf16: its only path there): _linear_pointwise(h, packed, b, "none", [], "")
static torch::Tensor onednn_linear(const torch::Tensor& h, const torch::Tensor& packed, const torch::Tensor& b) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  std::vector<c10::IValue> stack{h, packed, b.numel() ? c10::IValue(b) : c10::IValue(), std::string("none"),
                                 c10::List<std::optional<at::Scalar>>(), std::string("")};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// h @ w.T + b as PackedLinear computes it: with `onednn`, oneDNN on `mat` (its packed copy); else the
// GEMV up to small_m rows (its SMALL_M) and the GEMM on `mat` (the panels) above
static torch::Tensor linear(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& mat,
                            const torch::Tensor& b, int64_t small_m, bool onednn) {
  if (onednn) return onednn_linear(h, mat, b);
  if (h.size(0) <= small_m) return gemv_k::gemv(h, w, b);
  TORCH_CHECK(mat.numel(), "decode_layer: more than small_m rows need the GEMM's panels");
  return gemm_k::gemm(h, mat, w.size(0), b);
}

// x (N, hidden) fp32 or bf16 -> x after one decoder layer; every row one decoding sequence
torch::Tensor decode_layer(torch::Tensor x, torch::Tensor ln1, torch::Tensor ln2, double eps, torch::Tensor w_qkv,
                           torch::Tensor b_qkv, torch::Tensor w_o, torch::Tensor w_gate_up, torch::Tensor w_down,
                           std::vector<torch::Tensor> mats, int64_t small_m, bool onednn,
                           int64_t H, int64_t Hkv, double scale, torch::Tensor cos, torch::Tensor sin,
                           torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots,
                           torch::Tensor tables, torch::Tensor lens) {
  const int64_t N = x.size(0), D = k_cache.size(3), I = w_down.size(1);
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == at::kFloat || onednn),
              "decode_layer: x (N, hidden) fp32, or any dtype oneDNN multiplies");
  auto h = torch::empty_like(x);
  ops_k::rms_norm(x, ln1, eps, h);
  auto qkv = linear(h, w_qkv, mats[0], b_qkv, small_m, onednn);  // (N, (H + 2 Hkv) D)
  auto q = qkv.narrow(1, 0, H * D).view({N, H, D});
  auto k = qkv.narrow(1, H * D, Hkv * D).view({N, Hkv, D});
  auto v = qkv.narrow(1, (H + Hkv) * D, Hkv * D).view({N, Hkv, D});
  ops_k::rope_(q, cos, sin);
  ops_k::rope_(k, cos, sin);
  k_cache.view({-1, Hkv, D}).index_copy_(0, slots, k);
  v_cache.view({-1, Hkv, D}).index_copy_(0, slots, v);
  auto o = torch::empty({N, H, D}, x.options());
  attn_k::decode(q.contiguous(), k_cache, v_cache, tables, lens, scale, o);
  auto empty = x.new_empty({0});
  x = x + linear(o.view({N, H * D}), w_o, mats[1], empty, small_m, onednn);
  ops_k::rms_norm(x, ln2, eps, h);
  auto gu = linear(h, w_gate_up, mats[2], empty, small_m, onednn);  // (N, 2 I): gate, up
  auto m = torch::empty({N, I}, x.options());
  ops_k::silu_mul(gu, m);
  return x + linear(m, w_down, mats[3], empty, small_m, onednn);
}
"""

SOURCE = _compose()


@functools.cache
def module():
    """The compiled extension (built once per process; the build itself is cached on disk)."""
    return cpu_build.load("inferlab_cpu_decode_layer", SOURCE, ["decode_layer"])
