// The kernels' entry points, one per exported function (bindings.cpp exposes them to Python, and
// reference_engine/kernels/ops.py wraps each; the decoder layer, decode_layer.cpp, calls them directly).
// Each is a named torch.profiler region.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace inferlab {

// linear.cpp: y = x @ W.T (+ bias) for any row count, packed = W's (P, K, 32) k-major panels
at::Tensor linear(at::Tensor x, at::Tensor packed, int64_t N, at::Tensor bias);
// linear_bf16.cpp: the same for bf16 x and W's (P, K/2, 32, 2) pair panels; path 2: AMX where it runs
// and K % 32 == 0, 1: vdpbf16ps where bf16_native(), 0: the widening FMAs (1 and 0 give the same sums)
at::Tensor linear_bf16(at::Tensor x, at::Tensor packed, int64_t N, at::Tensor bias, int64_t path);
bool bf16_native();
// linear.cpp: rows ids of W read from its panels (fp32 or bf16), exact: a tied embedding's lookup
void panel_rows(at::Tensor packed, at::Tensor ids, at::Tensor out);
// linear_amx.cpp: does the bf16 GEMM run on AMX here? (CPU, OS and INFERLAB_AMX; its path: amx.h)
bool amx_ready();
// linear_bf16.cpp: silu(gate) * up straight from the stacked gate_up panels on AMX (N = 2 I)
at::Tensor linear_silu(at::Tensor x, at::Tensor packed, int64_t N);
// fused_ops.cpp: RMSNorm, SiLU-and-multiply, rotary in place (fp32 or bf16)
void rms_norm(at::Tensor x, at::Tensor w, double eps, at::Tensor out);
void add_rms_norm(at::Tensor x, at::Tensor a, at::Tensor w, double eps, at::Tensor sum, at::Tensor out);
void silu_mul(at::Tensor gu, at::Tensor out);
void rope_(at::Tensor x, at::Tensor cos, at::Tensor sin);
// attention_decode.cpp / attention_prefill.cpp: attention over the paged KV cache
void decode(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
            at::Tensor seq_lens, double scale, at::Tensor out);
void prefill(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
             at::Tensor seq_lens, at::Tensor query_start, double scale, at::Tensor out);
// attention_amx.cpp: prefill's contract for bf16 on AMX (where amx_ready() and D % 32 == 0), its own sums
void prefill_amx(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor block_tables,
                 at::Tensor seq_lens, at::Tensor query_start, double scale, at::Tensor out);
// kv_write.cpp: cache rows slots[i] = k[i], v[i] (the step's keys and values into the paged cache)
void kv_write(at::Tensor k, at::Tensor v, at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots);
// decode_layer.cpp: one decoder layer for an all-decode batch
at::Tensor decode_layer(at::Tensor x, at::Tensor ln1, at::Tensor ln2, double eps, std::vector<at::Tensor> mats,
                        at::Tensor b_qkv, std::vector<int64_t> outs, bool onednn, int64_t H, int64_t Hkv,
                        double scale, at::Tensor cos, at::Tensor sin, at::Tensor k_cache, at::Tensor v_cache,
                        at::Tensor slots, at::Tensor tables, at::Tensor lens);

}  // namespace inferlab
