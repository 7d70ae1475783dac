// One decoder layer for an all-decode batch: the same kernels, in the same order, as the module path
// (reference_engine/kernels/ops.py's decode_layer).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_like.h>

#include "common.h"
#include "kernels.h"

namespace inferlab {

// oneDNN's packed linear through the dispatcher, as PackedLinear calls it from Python (the fallback,
// INFERLAB_LINEAR=onednn): _linear_pointwise(h, packed, b, "none", [], "")
static at::Tensor onednn_linear(const at::Tensor& h, const at::Tensor& packed, const at::Tensor& b) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  std::vector<c10::IValue> stack{h, packed, b.numel() ? c10::IValue(b) : c10::IValue(), std::string("none"),
                                 c10::List<std::optional<at::Scalar>>(), std::string("")};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// h @ W.T + b as PackedLinear computes it: with `onednn`, oneDNN on `mat` (its packed copy); else the
// panel GEMM on `mat` (W's one resident copy, n output columns; fp32, or bf16 pair panels)
static at::Tensor project(const at::Tensor& h, const at::Tensor& mat, int64_t n, const at::Tensor& b, bool onednn) {
  return onednn ? onednn_linear(h, mat, b) : linear(h, mat, n, b);
}

// x (N, hidden) fp32 or bf16 -> x after one decoder layer; every row one decoding sequence. mats: the
// packed qkv, o, gate_up and down projections; outs: their output widths
at::Tensor decode_layer(at::Tensor x, at::Tensor ln1, at::Tensor ln2, double eps, std::vector<at::Tensor> mats,
                        at::Tensor b_qkv, std::vector<int64_t> outs, bool onednn, int64_t H, int64_t Hkv,
                        double scale, at::Tensor cos, at::Tensor sin, at::Tensor k_cache, at::Tensor v_cache,
                        at::Tensor slots, at::Tensor tables, at::Tensor lens) {
  PROFILE("inferlab::decode_layer");
  TORCH_CHECK(mats.size() == 4 && outs.size() == 4, "decode_layer: four projections");
  const int64_t N = x.size(0), D = k_cache.size(3), I = outs[2] / 2;
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == mats[0].scalar_type() || onednn),
              "decode_layer: x (N, hidden) in the panels' dtype (fp32, bf16), or any dtype oneDNN multiplies");
  auto h = at::empty_like(x);
  rms_norm(x, ln1, eps, h);
  auto qkv = project(h, mats[0], outs[0], b_qkv, onednn);  // (N, (H + 2 Hkv) D)
  auto q = qkv.narrow(1, 0, H * D).view({N, H, D});
  auto k = qkv.narrow(1, H * D, Hkv * D).view({N, Hkv, D});
  auto v = qkv.narrow(1, (H + Hkv) * D, Hkv * D).view({N, Hkv, D});
  rope_(q, cos, sin);
  rope_(k, cos, sin);
  kv_write(k, v, k_cache, v_cache, slots);
  auto o = at::empty({N, H, D}, x.options());
  decode(q.contiguous(), k_cache, v_cache, tables, lens, scale, o);
  auto empty = x.new_empty({0});
  x = x.add(project(o.view({N, H * D}), mats[1], outs[1], empty, onednn));  // x + y, as the module path
  rms_norm(x, ln2, eps, h);
  at::Tensor m;  // (N, I)
  if (!onednn && x.scalar_type() == at::kBFloat16 && amx_ready() && h.size(1) % 32 == 0 && I % 32 == 0) {
    m = linear_silu(h, mats[2], outs[2]);  // SiLU-and-multiply in the GEMM's epilogue, as FusedMLP
  } else {
    auto gu = project(h, mats[2], outs[2], empty, onednn);  // (N, 2 I): gate, up
    m = at::empty({N, I}, x.options());
    silu_mul(gu, m);
  }
  return x.add(project(m, mats[3], outs[3], empty, onednn));
}

}  // namespace inferlab
