"""The reference attention backend ("torch"): gather each sequence's cached blocks and call SDPA.

Runs on any device and dtype; the other backends (`cpu_backend.py`, `triton_backend.py`) are
checked against it. Slow by design where it copies: a decode gathers every sequence's whole
context into a fresh tensor each layer and step.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from reference_engine.attention.interface import AttentionBackend

# SDPA backends the torch backend uses on CUDA: all but cuDNN's. cuDNN attention (PyTorch's first
# choice for fp16/bf16 on Hopper since 2.9; it takes no fp32) builds an execution plan for every new
# shape, and a decode step's context length is new every step (docs/engine.md, "bf16 on CUDA").
CUDA_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]



class TorchBackend(AttentionBackend):
    """Pure PyTorch: gathers each sequence's blocks and calls SDPA. Runs anywhere."""

    def forward(self, layer, q, k, v, meta, scale):
        k_cache, v_cache = self.kv[layer]
        hkv, d = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, hkv, d).index_copy_(0, meta.slot_mapping, k)
        v_cache.view(-1, hkv, d).index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, meta, scale)
        for i in range(nd, len(meta.query_lens)):
            s, e = meta.query_start[i], meta.query_start[i + 1]
            ctx = meta.seq_lens_list[i]
            if ctx == e - s:  # nothing cached before this chunk: attend to this step's k/v directly
                ks, vs = k[s:e], v[s:e]
            else:
                ks, vs = self._gather(k_cache, v_cache, meta.block_tables[i], ctx)
            out[s:e] = _sdpa(q[s:e].unsqueeze(0), ks.unsqueeze(0), vs.unsqueeze(0), scale,
                             _causal_mask(e - s, ctx, q.device)).squeeze(0)
        return out

    def _gather(self, k_cache, v_cache, table, ctx):
        nblk = -(-ctx // self.block_size)
        blocks = table[:nblk]
        hkv, d = k_cache.shape[2], k_cache.shape[3]
        ks = k_cache[blocks].view(-1, hkv, d)[:ctx]  # (ctx, Hkv, D)
        vs = v_cache[blocks].view(-1, hkv, d)[:ctx]
        return ks, vs

    def _decode(self, q, k_cache, v_cache, meta, scale):
        # One query per sequence: gather all their blocks at once, mask past each length.
        nd, ctx = q.shape[0], meta.max_decode_len
        nblk = -(-ctx // self.block_size)
        tables = meta.block_tables[:nd, :nblk]  # (B, nblk)
        hkv, d = k_cache.shape[2], k_cache.shape[3]
        ks = k_cache[tables].view(nd, -1, hkv, d)[:, :ctx]  # (B, ctx, Hkv, D)
        vs = v_cache[tables].view(nd, -1, hkv, d)[:, :ctx]
        mask = torch.arange(ctx, device=q.device)[None, :] < meta.seq_lens[:nd, None]  # (B, ctx)
        return _sdpa(q.unsqueeze(1), ks, vs, scale, mask[:, None, None, :]).squeeze(1)


def _causal_mask(q_len: int, ctx: int, device) -> torch.Tensor | None:
    """Query j sits at absolute position ctx - q_len + j and sees keys up to it. None = plain causal."""
    if q_len == ctx:
        return None
    rows = torch.arange(ctx - q_len, ctx, device=device)[:, None]
    return (torch.arange(ctx, device=device)[None, :] <= rows)[None, None]  # (1, 1, T, ctx)


def _sdpa(q, k, v, scale, mask):
    """q: (B, T, H, D), k/v: (B, S, Hkv, D), mask broadcastable to (B, H, T, S) or None (causal)."""
    if q.is_cuda:
        with sdpa_kernel(CUDA_SDPA):
            return _sdpa_any(q, k, v, scale, mask)
    return _sdpa_any(q, k, v, scale, mask)


def _sdpa_any(q, k, v, scale, mask):
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
    gqa = q.shape[1] != k.shape[1]
    if mask is None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1, scale=scale, enable_gqa=gqa)
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return o.transpose(1, 2)  # (B, T, H, D)
