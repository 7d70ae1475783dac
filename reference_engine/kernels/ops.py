"""The C++ CPU kernels' one Python surface: a typed wrapper per entry point of csrc/kernels.h, in its order,
and `available()`. Every other module calls the kernels through these; `cpu_build.py` builds the
extension they call (once per process, cached on disk per vector ISA).

Conventions: tensors are CPU, fp32 or bf16 (bf16 is widened to fp32 as it is read, sums run in fp32,
results are rounded to bf16 where HF's PyTorch code rounds); `out` arguments are written in place and
shaped as the result. Each call is a torch.profiler region named `inferlab::<entry point>`. Shapes: N
rows (tokens), H query heads and Hkv kv heads of size D, B sequences, the paged KV cache
(num_blocks, block_size, Hkv, D) read in place through int64 block tables (B, max_blocks).
"""
from __future__ import annotations

import functools

from torch import Tensor

from reference_engine.kernels import cpu_build


@functools.cache
def available() -> bool:
    """Does the kernels' extension build and load here? False without a C++ compiler (the PyTorch code
    serves instead); a failed build with one is logged in one warning line (`cpu_build.builds`).
    `make setup` calls it to prebuild the extension."""
    return cpu_build.builds(cpu_build.module)


def _ext():
    return cpu_build.module()


def _bias(bias: Tensor | None, x: Tensor) -> Tensor:
    return bias if bias is not None else x.new_empty(0)  # the kernels read an empty tensor as no bias


# Linear layers on W's panels (layout, rounding and why: cpp_gemm.py).

def linear(x: Tensor, packed: Tensor, n: int, bias: Tensor | None = None) -> Tensor:
    """y (M, n) = x @ W.T (+ bias) for x (M, K) rows (unit column stride) and `packed` = cpp_gemm.pack(W) of
    W (n, K): fp32 panels (P, K, 32), or bf16 x on bf16 pair panels (P, K/2, 32, 2) on the best path here.
    fp32: one k-ordered FMA chain per output, whatever M, the thread or the ISA (csrc/linear.cpp)."""
    return _ext().linear(x, packed, n, _bias(bias, x))


PATHS = {"amx": 2, "vdpbf16ps": 1, "fma": 0}  # the bf16 paths, best first (csrc/linear_bf16.cpp)


def linear_bf16(x: Tensor, packed: Tensor, n: int, bias: Tensor | None = None, path: str = "amx") -> Tensor:
    """`linear` for bf16 x (M, K) on bf16 pair panels, on the best path here up to `path`: "amx" (where AMX runs
    and K % 32 == 0: its own sums), "vdpbf16ps" (AVX512_BF16) or "fma" (the pairs widened to fp32: the same
    bits as vdpbf16ps' pair order). y (M, n) bf16, the fp32 sum + bias rounded once."""
    return _ext().linear_bf16(x, packed, n, _bias(bias, x), PATHS[path])


def bf16_native() -> bool:
    """Does the bf16 kernel run vdpbf16ps here (an AVX-512 build on a CPU with AVX512_BF16)?"""
    return _ext().bf16_native()


def panel_rows(packed: Tensor, ids: Tensor, out: Tensor) -> None:
    """out (len(ids), K) = W[ids] read from W's panels (fp32, or bf16 with K rounded up to even), exact copies:
    a tied embedding's lookup. ids int64, contiguous; an id past the panels' columns raises."""
    _ext().panel_rows(packed, ids, out)


def amx_ready() -> bool:
    """Does the bf16 GEMM run on AMX here (an AVX-512 build, a CPU with AMX-BF16, Linux's permission for the
    tile data, INFERLAB_AMX not 0)? Then every bf16 product with K % 32 == 0 takes it, at any row count."""
    return _ext().amx_ready()


def linear_silu(x: Tensor, packed: Tensor, n: int) -> Tensor:
    """silu(x @ Wg.T) * (x @ Wu.T) (M, n / 2) for bf16 x (M, K) on the pair panels of W = [Wg; Wu] (n, K), on
    AMX: SiLU-and-multiply in the GEMM's epilogue, so the (M, n) product is never written; the same bits
    as `linear_bf16` then `silu_mul`. Only where cpp_gemm.silu_fuses(K, n)."""
    return _ext().linear_silu(x, packed, n)


# The decoder's element-wise stages, one pass over memory each (csrc/fused_ops.cpp). PyTorch runs RMSNorm
# as six ops, rotary as eight and SiLU-and-multiply as three, each a pass with its own intermediate and
# OpenMP fork; for a decode batch those passes cost more than their arithmetic. bf16 is rounded back
# where HF rounds (after the normalisation and after the weight multiply; each rotary product and the
# sum). fp32 results equal PyTorch's up to the order of RMSNorm's mean and SiLU's exp; rotary is
# bit-identical (no contracted multiply-adds: cpu_build.FLAGS). Rows go to torch's intra-op threads
# only when there are enough of them, so a small decode batch runs on the calling thread.

def rms_norm(x: Tensor, w: Tensor, eps: float, out: Tensor) -> None:
    """out (N, H) = w * (x / sqrt(mean(x^2) + eps)) for x (N, H) rows (unit column stride), w (H,), HF's order."""
    _ext().rms_norm(x, w, eps, out)


def add_rms_norm(x: Tensor, a: Tensor, w: Tensor, eps: float, sum: Tensor, out: Tensor) -> None:
    """sum = x + a (N, H), rounded to the dtype; out = rms_norm(sum): a layer's residual add and second norm."""
    _ext().add_rms_norm(x, a, w, eps, sum, out)


def silu_mul(gu: Tensor, out: Tensor) -> None:
    """out (N, I) = silu(gu[:, :I]) * gu[:, I:] for the gate_up product gu (N, 2I)."""
    _ext().silu_mul(gu, out)


def rope_(x: Tensor, cos: Tensor, sin: Tensor) -> None:
    """In place: x = x * cos + rotate_half(x) * sin for x (N, heads, D) with strided rows (q or k as views of
    the qkv projection's output), cos and sin (N, 1, D) contiguous, in x's dtype."""
    _ext().rope_(x, cos, sin)


# Attention over the paged KV cache, read in place through the block table (no context is copied), an
# online softmax in fp32; out has q's dtype. Shared by decode and prefill: csrc/attention.h.

def decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float,
           out: Tensor) -> None:
    """One query token per sequence: q (B, H, D) contiguous, seq_lens (B,) int64 context lengths (the query's
    own key included), out (B, H, D). One task per (sequence, kv head) (csrc/attention_decode.cpp), reading
    each key and value row once for the H/Hkv query heads that share it, register-blocked three heads at a
    time with the sums of the one-head loops: bit-identical to them."""
    _ext().decode(q, k_cache, v_cache, block_tables, seq_lens, scale, out)


def prefill(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor,
            query_start: Tensor, scale: float, out: Tensor) -> None:
    """Chunks of several query tokens per sequence, causal: q (N, H, D) contiguous, the B chunks back to back
    at offsets query_start (B+1,) int64; each token attends to its sequence's keys in the cache up to its
    own position (prefix-cached context and earlier chunks included); out (N, H, D).

    One task per (sequence, 16-row tile, kv head) (csrc/attention_prefill.cpp). A task holds its R = 16 G query
    vectors transposed, (D, R8) (R padded to a multiple of 8), and keeps a block's scores key-major, so a
    score tile is 16 rows x 6 keys in registers summed over d with one broadcast key element: no horizontal
    sums. Every score and output element sums its terms in a fixed order (d, then keys), whatever the tile
    or thread."""
    _ext().prefill(q, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out)


def prefill_amx(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor,
                query_start: Tensor, scale: float, out: Tensor) -> None:
    """`prefill`'s contract for bf16 on AMX, where amx_ready() and D % 32 == 0 (csrc/attention_amx.cpp). q may be
    a view with any token stride (the qkv projection's rows). A task (sequence, kv head, 32 query tokens)
    lays out the keys it sees once as K^T and V in AMX's B-tile order; per 16 query rows, S = Q K^T and
    O = P V are tile products, the softmax is online in fp32 over 256-key chunks at fixed key positions,
    P is rounded to bf16 before P V. A row's bits depend on its query, its keys and those chunks only:
    batch-, tile- and prefix-invariant, but not `prefill`'s bits."""
    _ext().prefill_amx(q, k_cache, v_cache, block_tables, seq_lens, query_start, scale, out)


def kv_write(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor) -> None:
    """The step's keys and values into the paged cache: rows slots[i] (int64, block * block_size + offset) of
    k_cache and v_cache = k[i], v[i] for k, v (N, Hkv, D); what TorchBackend's index_copy_ writes."""
    _ext().kv_write(k, v, k_cache, v_cache, slots)


def decode_layer(x: Tensor, ln1: Tensor, ln2: Tensor, eps: float, mats: list[Tensor], b_qkv: Tensor,
                 outs: list[int], onednn: bool, H: int, Hkv: int, scale: float, cos: Tensor, sin: Tensor,
                 k_cache: Tensor, v_cache: Tensor, slots: Tensor, tables: Tensor, lens: Tensor) -> Tensor:
    """One decoder layer for N decoding sequences, x (N, hidden) -> x after the layer (csrc/decode_layer.cpp):
    the kernels above in the order of `DecoderLayer.forward` with the fused modules, PackedLinear and the CPU
    attention backend, so the result is bit-identical to that path (model/fused_decode.py) without its ~15
    small ops' Python and dispatcher overhead per layer:

        h   = rms_norm(x, ln1)
        qkv = project(h, mats[0]) + b_qkv -> q (N, H, D), k, v (N, Hkv, D) views;  q, k = rope_(q), rope_(k)
        kv_write(k, v, k_cache, v_cache, slots)
        x   = x + project(decode(q, caches, tables, lens), mats[1])
        x   = x + project(silu_mul(project(rms_norm(x, ln2), mats[2])), mats[3])

    mats: the qkv, o, gate_up and down projections' one copy (panels, fp32 or bf16; with `onednn`, oneDNN's
    packed copies, multiplied as PackedLinear does), outs their output widths; b_qkv may be empty; cos, sin
    (N, 1, D). On AMX the gate_up product and SiLU-and-multiply are one `linear_silu`."""
    return _ext().decode_layer(x, ln1, ln2, eps, mats, b_qkv, outs, onednn, H, Hkv, scale, cos, sin, k_cache,
                               v_cache, slots, tables, lens)
