"""Triton attention backend ("triton"): `TorchBackend`'s contract, as GPU kernels.

For GPU users
-------------
Pick it with `EngineConfig(attention_backend="triton")`, or let
`default_attention_backend(device)` choose: "triton" on CUDA when `triton` imports, else "torch".
Install: `pip install triton==3.7.1` (the version torch 2.13.0's CUDA wheels pin). Per layer and
step the backend launches (kernels in `reference_engine/attention/triton_kernels.py`):

1. `store_kv_kernel`, grid `(cdiv(N, BLOCK_T),)`: each program copies BLOCK_T tokens' K and V
   (each `(Hkv, D)`, BLOCK_T*Hkv*D ~ 4096 elements) into the paged cache at `slot_mapping[t]`;
   a negative slot (padding) writes nothing.
2. `paged_attention_kernel`, grid `(N // BLOCK_M + B, Hkv, splits)` (`(N, Hkv, splits)` when
   every query is one token): one program per (query block, kv head, key split). A query block
   is up to BLOCK_M consecutive tokens of one sequence times the H/Hkv query heads that share the
   kv head (GQA: each K/V tile is loaded once for the whole group), found by a binary search of
   `cu_qblk`. Keys come from the cache through the block table, so prefix-cached blocks and
   earlier chunks are read like any other context. The causal mask is on absolute positions:
   token j of a q_len-token chunk in a sequence of length ctx sits at ctx - q_len + j and sees
   keys up to it. Decodes (q_len 1), prefill chunks, prefill on prefix-cached context and
   speculative verification (k+1 tokens on cached context) are the same code path. fp16, bf16
   or fp32 in; scores, softmax (online, exp2) and accumulation in fp32.
3. Split-K (flash-decoding): when the grid is smaller than the GPU and contexts are long (decode
   batches), each program's keys are cut into `splits` tile-aligned parts; every part writes a
   normalized partial output and its log-sum-exp, and `merge_splits_kernel`, grid
   `(N, cdiv(H, BLOCK_H))` (BLOCK_H*splits*D ~ 4096), combines them.
   `TritonBackend(num_splits=...)` fixes the count (tests, captured graphs).

Block shapes: BLOCK_N = 64 keys (32 if head_dim > 128); query rows BLOCK_R = 64 (16 for
decode-only steps), i.e. BLOCK_M = BLOCK_R // (H/Hkv) tokens; fp32 uses 32 keys and 32 rows.
num_warps 4, Triton's default pipelining. Any cache block size works: each key's block id is
looked up individually.

On CPU the kernels run in Triton's interpreter when TRITON_INTERPRET=1 is set before
`reference_engine.attention.triton_kernels` is first imported; that is how CI checks them
against `TorchBackend` (tests/reference_engine/attention/test_triton_backend.py).
"""
from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass

import torch

from reference_engine.attention.interface import AttentionBackend, AttentionMetadata

TRITON_REQUIREMENT = "triton==3.7.1"
INSTALL_HINT = (f"attention backend 'triton' needs the triton package: pip install '{TRITON_REQUIREMENT}' "
                "(or the project's [gpu] extra)")
SPLIT_MIN_KEYS = 256  # a split gets at least this many keys, so the merge stays a small fraction
MAX_SPLITS = 32
STORE_TILE = 4096  # elements one KV-store program moves per tensor
MERGE_TILE = 4096  # partial-output elements one merge program reads


@functools.cache
def triton_available() -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # a broken install counts as absent
        return False
    return True


def backend_class() -> type[TritonBackend]:
    """What `attention.get_backend("triton")` returns; a one-line ImportError without triton."""
    _kernels()
    return TritonBackend


def _kernels():
    if not triton_available():
        raise ImportError(INSTALL_HINT)
    from reference_engine.attention import triton_kernels as paged_attention
    return paged_attention


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1  # interpreter: splits only when asked for


def pick_num_splits(programs: int, max_seq_len: int, device: torch.device) -> int:
    """Split keys only when the grid leaves SMs idle; aim at ~2 programs per SM."""
    sms = _num_sms(device)
    if programs >= sms or max_seq_len < 2 * SPLIT_MIN_KEYS:
        return 1
    return max(1, min(MAX_SPLITS, -(-2 * sms // programs), max_seq_len // SPLIT_MIN_KEYS))


@dataclass
class StepPlan:
    """Per-step launch data, shared by every layer. The tensors live on the cache's device."""
    cu_q: torch.Tensor  # (B+1,) int32 query offsets
    cu_qblk: torch.Tensor  # (B+1,) int32 first query-block id per sequence
    seq_lens: torch.Tensor  # (B,) int32 context length after this step
    block_m: int  # query tokens per block
    block_r: int  # rows per block: block_m * group, padded to a power of two >= 16
    block_n: int  # keys per tile
    grid_q: int  # upper bound on query blocks
    num_splits: int


def plan_step(cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, max_query_len: int, max_seq_len: int,
              num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int,
              dtype: torch.dtype = torch.float16, *, num_splits: int | None = None,
              block_r: int | None = None, block_n: int | None = None) -> StepPlan:
    """Block shapes and query-block offsets for one step (device ops only, no host sync).

    num_splits None picks by `pick_num_splits`; block_r / block_n override the defaults."""
    group = num_heads // num_kv_heads
    b = seq_lens.shape[0]
    # fp32 tiles take twice the registers and shared memory: halve them (64x64 fp32 needs ~116 KB
    # of shared memory at head_dim 128, more than sm_86/89 GPUs have).
    wide = dtype != torch.float32
    block_n = block_n or (64 if head_dim <= 128 and wide else 32)
    target = block_r or (16 if max_query_len <= 1 else 64 if wide else 32)
    block_m = max(1, min(max_query_len, target // group))
    rows = _pow2(max(16, block_m * group))
    cu_q = cu_seqlens_q.to(torch.int32)
    q_lens = cu_q[1:] - cu_q[:-1]
    cu_qblk = torch.zeros(b + 1, dtype=torch.int32, device=cu_q.device)
    cu_qblk[1:] = torch.cumsum(torch.div(q_lens + block_m - 1, block_m, rounding_mode="floor"), 0)
    # sum(cdiv(q_len, M)) <= N // M + B; with M = 1 it is exactly N.
    grid_q = num_tokens if block_m == 1 else num_tokens // block_m + b
    if num_splits is None:
        num_splits = pick_num_splits(grid_q * num_kv_heads, max_seq_len, cu_q.device)
    return StepPlan(cu_q, cu_qblk, seq_lens.to(torch.int32), block_m, rows, block_n, grid_q, num_splits)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: (N, Hkv, D) -> cache (num_blocks, block_size, Hkv, D) at slot_mapping (N,)."""
    n = k.shape[0]
    if n == 0:
        return
    _, block_size, hkv, d = k_cache.shape
    cols = _pow2(hkv) * _pow2(d)
    block_t = min(_pow2(n), max(1, STORE_TILE // cols))  # tokens per program: ~STORE_TILE elements
    _kernels().store_kv_kernel[(_cdiv(n, block_t),)](
        k, v, k_cache, v_cache, slot_mapping, n, block_size, hkv, d,
        *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        BLOCK_T=block_t, BLOCK_H=_pow2(hkv), BLOCK_D=_pow2(d))


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
           plan: StepPlan, scale: float) -> torch.Tensor:
    """q: (N, H, D) over the paged cache -> (N, H, D). Rows past cu_q[-1] (padding) are left unset."""
    kern = _kernels()
    n, h, d = q.shape
    hkv = k_cache.shape[2]
    out = torch.empty_like(q)
    if n == 0 or plan.grid_q == 0:
        return out
    if q.dtype != k_cache.dtype:
        raise TypeError(f"query dtype {q.dtype} differs from the KV cache's {k_cache.dtype}")
    splits = plan.num_splits
    if splits > 1:
        part_o = torch.empty((n, h, splits, d), dtype=torch.float32, device=q.device)  # (N, H, S, D)
        part_lse = torch.empty((n, h, splits), dtype=torch.float32, device=q.device)  # (N, H, S)
        po_strides, pl_strides = part_o.stride(), part_lse.stride()
    else:  # unused by the kernel (SPLIT is a compile-time False)
        part_o = part_lse = out
        po_strides, pl_strides = (0, 0, 0, 0), (0, 0, 0)
    block_d = _pow2(max(16, d))
    kern.paged_attention_kernel[(plan.grid_q, hkv, splits)](
        q, k_cache, v_cache, out, part_o, part_lse,
        block_tables, plan.seq_lens, plan.cu_q, plan.cu_qblk,
        plan.seq_lens.shape[0], k_cache.shape[1], d, scale * math.log2(math.e),
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        *po_strides, *pl_strides,
        GROUP=h // hkv, BLOCK_M=plan.block_m, BLOCK_R=plan.block_r, BLOCK_N=plan.block_n, BLOCK_D=block_d,
        SPLIT=splits > 1, UPCAST=kern.INTERPRETED and q.dtype == torch.bfloat16,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None)
    if splits > 1:
        block_s = _pow2(splits)
        block_h = min(_pow2(h), max(1, MERGE_TILE // (block_s * block_d)))
        kern.merge_splits_kernel[(n, _cdiv(h, block_h))](
            part_o, part_lse, out, h, splits, d, *po_strides, *pl_strides, *out.stride(),
            BLOCK_H=block_h, BLOCK_S=block_s, BLOCK_D=block_d)
    return out


class TritonBackend(AttentionBackend):
    """Paged attention in Triton kernels. Same inputs and outputs as `TorchBackend`.

    num_splits: None = per-step heuristic, an int = always that many key splits (a step's
    `meta.num_splits`, set by a captured graph, wins over both).
    block_r / block_n: override the query-row and key tile sizes (tests use small ones).
    Graph-safe: with `meta.cu_seqlens_q`, `max_query_len` and `max_seq_len` given, a step reads no
    Python list and copies nothing from the host."""

    graph_safe = True

    def __init__(self, kv_cache: list[tuple[torch.Tensor, torch.Tensor]], block_size: int, *,
                 num_splits: int | None = None, block_r: int | None = None, block_n: int | None = None):
        super().__init__(kv_cache, block_size)
        kern = _kernels()
        dev = kv_cache[0][0].device if kv_cache else None
        if dev is not None and dev.type != "cuda" and not kern.INTERPRETED:
            raise ValueError(f"attention backend 'triton' needs the KV cache on CUDA (it is on {dev}); "
                             "use attention_backend='torch' there")
        self.num_splits, self.block_r, self.block_n = num_splits, block_r, block_n
        self._meta: AttentionMetadata | None = None
        self._plan: StepPlan | None = None

    def new_step(self) -> None:
        self._meta = self._plan = None

    def graph_num_splits(self, num_seqs: int, max_seq_len: int) -> int:
        """Decode graphs cannot re-pick per step: split for the longest context the graph may see."""
        if self.num_splits is not None:
            return self.num_splits
        k_cache = self.kv[0][0]
        return pick_num_splits(num_seqs * k_cache.shape[2], max_seq_len, k_cache.device)

    def plan(self, meta: AttentionMetadata, num_tokens: int, num_heads: int) -> StepPlan:
        k_cache = self.kv[0][0]
        cu_q = meta.cu_seqlens_q
        if cu_q is None:  # a batch built without device offsets (make_batch): one small copy
            cu_q = torch.tensor(meta.query_start, dtype=torch.int32, device=k_cache.device)
        max_q = meta.max_query_len if meta.max_query_len is not None else max(meta.query_lens, default=0)
        max_s = meta.max_seq_len if meta.max_seq_len is not None else max(meta.seq_lens_list, default=0)
        splits = meta.num_splits if meta.num_splits is not None else self.num_splits
        return plan_step(cu_q, meta.seq_lens, max_q, max_s, num_tokens, num_heads, k_cache.shape[2],
                         k_cache.shape[3], k_cache.dtype, num_splits=splits, block_r=self.block_r,
                         block_n=self.block_n)

    def forward(self, layer, q, k, v, meta, scale):
        k_cache, v_cache = self.kv[layer]
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        if self._meta is not meta:  # one plan per step, reused by every layer
            self._plan, self._meta = self.plan(meta, q.shape[0], q.shape[1]), meta
        return attend(q, k_cache, v_cache, meta.block_tables, self._plan, scale)
