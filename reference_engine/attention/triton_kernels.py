"""Triton kernels for attention over the paged KV cache; launched by `reference_engine.attention.triton_backend`.

Layouts (every stride is passed, so views such as slices of a fused qkv projection work):
  q             (N, H, D)        this step's query tokens, sequences back to back
  k, v          (N, Hkv, D)      this step's keys/values
  k/v cache     (num_blocks, block_size, Hkv, D)
  block_tables  (B, max_blocks)  int32 or int64, physical block id per logical block
  seq_lens      (B,)   int32     context length after this step (cached + this chunk)
  cu_q          (B+1,) int32     query offsets of each sequence into the N tokens
  cu_qblk       (B+1,) int32     first query-block id of each sequence (cumsum of cdiv(q_len, BLOCK_M))

Whether a kernel runs compiled or in Triton's CPU interpreter is fixed when this module is
imported (Triton reads TRITON_INTERPRET when `@triton.jit` decorates); `INTERPRETED` records it.
The interpreter stores bfloat16 as raw uint16 and its `tl.dot` multiplies those bit patterns
(Triton's debugging guide: no bf16 arithmetic in the interpreter), so the launcher sets UPCAST
there and tiles are widened to fp32 right after loading; compiled kernels feed bf16 to the MMA.
"""
from __future__ import annotations

import triton
import triton.language as tl

# tl.max, tl.sum, tl.zeros and tl.cdiv are themselves @triton.jit helpers, and the interpreter can
# call those only if triton itself was imported with TRITON_INTERPRET=1. The kernels therefore use
# builtins only, reducing with tl.reduce over triton's own combiners (what tl.max / tl.sum compile
# to; the interpreter maps exactly these to numpy), so only this module's import time matters.
_MAX = tl.standard._elementwise_max
_SUM = tl.standard._sum_combine


@triton.jit
def store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    num_tokens, block_size, num_kv_heads, head_dim,
    s_kt, s_kh, s_kd, s_vt, s_vh, s_vd,
    s_kcb, s_kcs, s_kch, s_kcd, s_vcb, s_vcs, s_vch, s_vcd,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_T),): BLOCK_T tokens' (Hkv, D) keys and values go to cache slots
    slot_mapping[t]; a negative slot is padding and writes nothing."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)  # (BLOCK_T,)
    slot = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    dst = (slot // block_size) * s_kcb + (slot % block_size) * s_kcs  # (BLOCK_T,) row offset in the cache
    hd = tl.arange(0, BLOCK_H * BLOCK_D).to(tl.int64)  # one (head, dim) pair per column
    h = hd // BLOCK_D
    d = hd % BLOCK_D
    mask = (slot >= 0)[:, None] & ((h < num_kv_heads) & (d < head_dim))[None, :]  # (BLOCK_T, BLOCK_H*BLOCK_D)
    k = tl.load(k_ptr + t[:, None] * s_kt + (h * s_kh + d * s_kd)[None, :], mask=mask)
    tl.store(k_cache_ptr + dst[:, None] + (h * s_kch + d * s_kcd)[None, :],
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    dst = (slot // block_size) * s_vcb + (slot % block_size) * s_vcs
    v = tl.load(v_ptr + t[:, None] * s_vt + (h * s_vh + d * s_vd)[None, :], mask=mask)
    tl.store(v_cache_ptr + dst[:, None] + (h * s_vch + d * s_vcd)[None, :],
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_o_ptr, part_lse_ptr,
    block_tables_ptr, seq_lens_ptr, cu_q_ptr, cu_qblk_ptr,
    num_seqs, block_size, head_dim, scale_log2,
    s_qt, s_qh, s_qd,
    s_kb, s_ks, s_kh, s_kd,
    s_vb, s_vs, s_vh, s_vd,
    s_bt, s_btn,
    s_ot, s_oh, s_od,
    s_pt, s_ph, s_ps, s_pd,
    s_lt, s_lh, s_ls,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Grid (query blocks, Hkv, splits). One program: BLOCK_M query tokens of one sequence x the
    GROUP query heads sharing kv head `kvh`, packed into BLOCK_R rows (row r = token r // GROUP,
    head r % GROUP), so each K/V tile is read once for the whole GQA group. It scans its split
    of the keys it can see with an online softmax in fp32 (log2 domain). With SPLIT it writes the
    normalized partial output and its log-sum-exp for `merge_splits_kernel`; else the output."""
    pid = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    # The grid is an upper bound on the query blocks (it depends only on N and B, so a captured
    # graph can reuse it); programs past the last block have nothing to do.
    if pid >= tl.load(cu_qblk_ptr + num_seqs):
        return
    # Which sequence owns query block `pid`: the last s with cu_qblk[s] <= pid. Sequences with no
    # query tokens share their successor's offset and are skipped by taking the last one.
    lo = 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        ok = tl.load(cu_qblk_ptr + mid) <= pid
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    seq = lo
    qb = pid - tl.load(cu_qblk_ptr + seq)  # query block index within the sequence
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    # Absolute position of the chunk's first token: everything before it (prefix-cached blocks,
    # earlier chunks, the context a speculative verification builds on) is already in the cache.
    first_pos = tl.load(seq_lens_ptr + seq) - q_len

    # Offsets that get multiplied by strides are int64 (a large cache or batch must not wrap);
    # positions stay int32, where block-table arithmetic is cheap.
    r = tl.arange(0, BLOCK_R)
    tok = qb * BLOCK_M + r // GROUP  # token index within the chunk
    head = (kvh * GROUP + r % GROUP).to(tl.int64)  # query head
    row_ok = (r < BLOCK_M * GROUP) & (tok < q_len)
    pos = first_pos + tok  # (BLOCK_R,) absolute position: sees keys at positions <= pos
    d = tl.arange(0, BLOCK_D).to(tl.int64)
    d_ok = d < head_dim
    rows = q_start.to(tl.int64) + tok  # token row in q / out
    q = tl.load(q_ptr + rows[:, None] * s_qt + head[:, None] * s_qh + d[None, :] * s_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_R, BLOCK_D)
    if UPCAST:
        q = q.to(tl.float32)

    # Keys this block needs end at its last token; split `split` takes a tile-aligned share.
    kv_len = first_pos + tl.minimum((qb + 1) * BLOCK_M, q_len)
    # (integer arithmetic rather than tl.cdiv, a jit helper the interpreter re-patches on every call)
    tiles_per_split = ((kv_len + BLOCK_N - 1) // BLOCK_N + num_splits - 1) // num_splits
    k_lo = split * tiles_per_split * BLOCK_N
    k_hi = tl.minimum(k_lo + tiles_per_split * BLOCK_N, kv_len)

    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)  # running max of scaled scores (log2 units)
    l_i = tl.full([BLOCK_R], 0.0, tl.float32)  # running softmax denominator
    acc = tl.full([BLOCK_R, BLOCK_D], 0.0, tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * s_bt
    k_head = k_cache_ptr + kvh.to(tl.int64) * s_kh + (d * s_kd)[:, None]  # (BLOCK_D, 1)
    v_head = v_cache_ptr + kvh.to(tl.int64) * s_vh + (d * s_vd)[None, :]  # (1, BLOCK_D)
    # Padding rows get position -1 so they see no key.
    pos = tl.where(row_ok, pos, -1)[:, None]  # (BLOCK_R, 1)
    for start in range(k_lo, k_hi, BLOCK_N):
        kpos = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,) absolute key positions
        k_ok = kpos < k_hi
        # One table lookup per key, so BLOCK_N need not equal (or divide) the cache block size.
        blk = tl.load(table + (kpos // block_size).to(tl.int64) * s_btn, mask=k_ok, other=0).to(tl.int64)
        off = (kpos % block_size).to(tl.int64)
        kt = tl.load(k_head + (blk * s_kb + off * s_ks)[None, :],
                     mask=d_ok[:, None] & k_ok[None, :], other=0.0)  # (BLOCK_D, BLOCK_N)
        v = tl.load(v_head + (blk * s_vb + off * s_vs)[:, None],
                    mask=k_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, kt, input_precision=DOT_PRECISION) * scale_log2  # (BLOCK_R, BLOCK_N) fp32
        s = tl.where(k_ok[None, :] & (kpos[None, :] <= pos), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, _MAX))
        # A row that has seen no visible key yet keeps max -inf; subtracting 0 instead keeps
        # exp2 at 0 rather than NaN (-inf - -inf).
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.reduce(p, 1, _SUM)
        # P is rounded to the cache dtype for the second MMA, as on the GPU path.
        p = p.to(v_cache_ptr.dtype.element_ty)
        if UPCAST:
            p = p.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m_i = m_new

    has = l_i > 0.0  # false for padding rows and for a split whose keys this row cannot see
    l_safe = tl.where(has, l_i, 1.0)
    o = acc / l_safe[:, None]
    o_mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:
        tl.store(part_o_ptr + rows[:, None] * s_pt + head[:, None] * s_ph + split.to(tl.int64) * s_ps + d[None, :] * s_pd,
                 o, mask=o_mask)
        lse = tl.where(has, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(part_lse_ptr + rows * s_lt + head * s_lh + split.to(tl.int64) * s_ls, lse, mask=row_ok)
    else:
        tl.store(out_ptr + rows[:, None] * s_ot + head[:, None] * s_oh + d[None, :] * s_od,
                 o.to(out_ptr.dtype.element_ty), mask=o_mask)


@triton.jit
def merge_splits_kernel(
    part_o_ptr, part_lse_ptr, out_ptr,
    num_heads, num_splits, head_dim,
    s_pt, s_ph, s_ps, s_pd,
    s_lt, s_lh, s_ls,
    s_ot, s_oh, s_od,
    BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Grid (N, cdiv(H, BLOCK_H)): for one token and BLOCK_H heads, combine the split partials,
    each weighted by 2^(lse - max lse)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    sp = tl.arange(0, BLOCK_S).to(tl.int64)
    d = tl.arange(0, BLOCK_D).to(tl.int64)
    hs_ok = (h < num_heads)[:, None] & (sp < num_splits)[None, :]  # (BLOCK_H, BLOCK_S)
    lse = tl.load(part_lse_ptr + t * s_lt + h[:, None] * s_lh + sp[None, :] * s_ls,
                  mask=hs_ok, other=float("-inf"))
    m = tl.reduce(lse, 1, _MAX)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m[:, None])  # (BLOCK_H, BLOCK_S), 0 for splits that saw no key
    o_ptr = part_o_ptr + t * s_pt + (h[:, None] * s_ph + sp[None, :] * s_ps)[:, :, None] + (d * s_pd)[None, None, :]
    o = tl.load(o_ptr, mask=hs_ok[:, :, None] & (d < head_dim)[None, None, :], other=0.0)  # (BLOCK_H, BLOCK_S, BLOCK_D)
    o = tl.where(w[:, :, None] > 0.0, o, 0.0)  # weight 0 must not meet a non-finite partial (0 * inf = NaN)
    total = tl.reduce(w, 1, _SUM)
    res = tl.reduce(w[:, :, None] * o, 1, _SUM) / tl.where(total > 0.0, total, 1.0)[:, None]  # (BLOCK_H, BLOCK_D)
    tl.store(out_ptr + t * s_ot + h[:, None] * s_oh + d[None, :] * s_od, res.to(out_ptr.dtype.element_ty),
             mask=(h < num_heads)[:, None] & (d < head_dim)[None, :])


INTERPRETED = not isinstance(paged_attention_kernel, triton.runtime.jit.JITFunction)
