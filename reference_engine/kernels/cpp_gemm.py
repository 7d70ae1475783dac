"""The panels, every linear layer's one resident copy (32-column k-major), and the C++ GEMM that reads them
(ops.linear, ops.linear_bf16, ops.linear_silu): AVX-512, AVX2 + FMA or scalar (cpu_build picks the build
from torch's CPU capability).

One kernel for every row count: a decode step (1-12 rows; the dot-product GEMV on W as stored it
replaces read the same bytes), a decode batch (13-128; oneDNN's packed kernel reads W and multiplies
in turns, this one keeps the next panel in flight: docs/perf/2026-12-03-gemm.md) and prefill
(hundreds to thousands of rows, where oneDNN's copy served until 2026-12-04). No horizontal sums.

Layout: W (N, K) is packed once into panels of NR = 32 output columns, k-major,

    packed[p, k, j] = W[p * NR + j, k]        (P, K, NR), zero past N

so one k step of a panel is two AVX-512 vector loads (four AVX2 ones). The micro-kernel holds an
MR x NR tile of y in registers (AVX-512: MR = 12 rows of x, 24 accumulators; AVX2: MR = 3, 12), and
for each k broadcasts x[m, k] into an FMA with the panel's vectors: no shuffles. x is first packed
per block of rows (as many as fit 512 KB, so they stay in L2) into k-major row tiles, (K, MR) each, so
a tile's broadcasts come from one stream and the tile takes all of K in one pass, its sums never
leaving the registers; packing and no k slices made the prefill GEMM 1.10x faster than row-major x in
128-k slices (docs/perf/2026-12-05-prefill-gemm.md). The first row tile of a panel prefetches the
next panel. Threads split the panels: for one row block (a decode step) in spans grabbed from a shared
counter (common.h's `share`: a thread the OS took away does less); for many (a prefill) evenly, in one
parallel region that packs the next block into a second buffer between blocks (one barrier per block).

Rounding: y[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 0], W[n, 0], 0)) in k order, then + bias:
one fixed sequence per output whatever M, the tile, the thread or the instruction set (the scalar
build rounds with std::fma, once per step, as the vector FMAs do), so rows are batch-invariant and the
three builds give the same bits.

    pack(W (N, K) fp32[, out]) -> (P, K, NR)
    ops.linear(x (M, K) fp32 rows, packed, N, bias (N,) or None) -> y (M, N)

bf16 weights (csrc/linear_bf16.cpp): the same panels over k pairs, (P, K/2, NR, 2), one bf16 copy,

    packed[p, i, j, t] = W[p * NR + j, 2 i + t]        zero past N and past an odd K

so one pair step of a panel is two 512-bit vectors of 16 column pairs, what AVX512_BF16's vdpbf16ps
multiplies against a bf16 pair of x broadcast as 32 bits. x is bf16 (a bf16 model's activations);
every output is acc += x[2i+1] W[2i+1], then acc += x[2i] W[2i] in pair order (vdpbf16ps' documented
order; each product exact in fp32, one rounding per add), + bias in fp32, one rounding to bf16. Without
AVX512_BF16 (AVX-512 F, AVX2, scalar) each pair is widened to fp32 (a 16-bit shift, exact) and goes
through two FMAs in that order: the same bits (tests/reference_engine/kernels/test_cpp_gemm_bf16.py),
except where vdpbf16ps flushes denormals to zero.

AMX (csrc/linear_amx.cpp): a pair panel is already AMX's B layout (a tile is 16 pairs x 16 columns, a
panel row 128 bytes, so its halves are two tiles at a 128-byte stride), and an A tile is 16 rows of x as
they lie. Where the CPU has AMX-BF16 (and Linux grants the tile state), every bf16 product with K % 32 ==
0 takes it, at every row count: batch-invariant, but with AMX's own sums inside a tile step, so not the
pair order's bits. `bf16_path(k)` says which path a product takes; INFERLAB_AMX=0 turns AMX off.

Source: csrc/linear.cpp. `unpack` is pack's inverse (PackedLinear.weight, read on demand); `rows` gathers
W's rows from the panels (a tied embedding).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from reference_engine.kernels import ops

NR = 32  # output columns per panel: two AVX-512 vectors, four AVX2 ones


def shape(n: int, k: int, dtype: torch.dtype) -> tuple[int, ...]:
    """The panels' shape for W (n, k): fp32 (P, K, NR); bf16 (P, K/2, NR, 2), K rounded up to even."""
    p = -(-n // NR)
    return (p, -(-k // 2), NR, 2) if dtype == torch.bfloat16 else (p, k, NR)


def pack(weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """W (N, K) fp32 -> (P, K, NR) panels, k-major, zero past N: packed[p, k, j] = W[p * NR + j, k].
    bf16 W -> (P, K/2, NR, 2) pair panels: packed[p, i, j, t] = W[p * NR + j, 2 i + t] (K padded to even).
    `out`: where to write them (a contiguous tensor of `shape(N, K, dtype)`, e.g. from a huge-page arena)."""
    n, k = weight.shape
    p = -(-n // NR)
    if weight.dtype == torch.bfloat16:
        k2 = -(-k // 2)
        w = F.pad(weight.detach(), (0, 2 * k2 - k, 0, p * NR - n))  # (P * NR, 2 * k2)
        panels = w.view(p, NR, k2, 2).transpose(1, 2)  # (P, k2, NR, 2)
    else:
        w = F.pad(weight.detach().float(), (0, 0, 0, p * NR - n))  # (P * NR, K)
        panels = w.view(p, NR, k).transpose(1, 2)  # (P, K, NR)
    return panels.contiguous() if out is None else out.copy_(panels)


def unpack(packed: torch.Tensor, n: int, k: int | None = None) -> torch.Tensor:
    """pack's inverse: panels -> W (n, k), a fresh contiguous copy (k: bf16's K before padding)."""
    if packed.dim() == 4:  # (P, k2, NR, 2) -> (P, NR, k2, 2) -> (P * NR, 2 * k2)
        p, k2 = packed.shape[:2]
        return packed.transpose(1, 2).reshape(p * NR, 2 * k2)[:n, :k].contiguous()
    p, k, _ = packed.shape
    return packed.transpose(1, 2).reshape(p * NR, k)[:n].contiguous()  # (P, NR, K) -> (P * NR, K) -> (n, K)


def rows(packed: torch.Tensor, ids: torch.Tensor, k: int) -> torch.Tensor:
    """W[ids] (len(ids), k) gathered from the panels, exact copies (a tied embedding's lookup)."""
    out = packed.new_empty(len(ids), packed.shape[1] * (2 if packed.dim() == 4 else 1))  # (n, K), bf16 K even
    ops.panel_rows(packed, ids.long().contiguous(), out)
    return out if out.shape[1] == k else out[:, :k]


def bf16_path(k: int) -> str:
    """Which path a bf16 product of inner size k takes here: "amx", "vdpbf16ps" or "fma"."""
    return "amx" if k % 32 == 0 and ops.amx_ready() else "vdpbf16ps" if ops.bf16_native() else "fma"


def silu_fuses(k: int, n: int) -> bool:
    """Does a stacked gate_up of inner size k and n = 2 I outputs take `ops.linear_silu` here (AMX, k and I
    multiples of 32)?"""
    return k % 32 == 0 and n % 64 == 0 and ops.amx_ready()

