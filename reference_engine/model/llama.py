"""The model: a Llama/Qwen-family decoder written with plain torch ops.

One forward pass takes a *flattened* batch: all scheduled tokens of all sequences
concatenated into one `(N,)` vector (prefill chunks and decode tokens alike), their
positions, and attention metadata that says which tokens belong to which sequence
and where their keys/values live in the paged cache. No padding, no per-sequence loop
here: the attention backend is the only place that cares about sequence boundaries.

Parameter names match HF checkpoints (`model.layers.0.self_attn.o_proj.weight`, ...)
except where we stack projections that read the same input into one matmul:
`qkv_proj` (q, k, v) and `gate_up_proj` (gate, up); the loader knows the mapping.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from reference_engine.attention import AttentionBackend, AttentionMetadata
from reference_engine.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 like HF, then cast back before the weight multiply.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def add(self, x: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add before the norm: (x + a, norm(x + a)); the fused module does both in one pass."""
        x = x + a
        return x, self(x)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies `(D/2,)`, with Llama-3 style scaling when the config asks for it."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = cfg.rope_scaling
    if not sc:
        return inv
    kind = sc.get("rope_type", sc.get("type"))
    if kind == "linear":
        return inv / float(sc["factor"])
    if kind != "llama3":
        raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: llama3, linear")
    factor, low, high = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old_len = float(sc["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with a precomputed cos/sin table indexed by absolute position."""

    def __init__(self, cfg: ModelConfig, max_len: int):
        super().__init__()
        inv = rope_inv_freq(cfg)
        t = torch.arange(max_len, dtype=torch.int64).float()
        freqs = torch.outer(t, inv)  # (L, D/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (L, D)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for this step's positions `(N,)` -> `(N, 1, D)` each, looked up once per forward."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


def apply_rope(q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
    """q: (N, H, D), k: (N, Hkv, D); cos/sin broadcast over heads."""
    cos, sin = rope
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


class Rotary(nn.Module):
    """`apply_rope` as a module, so a fused kernel can stand in for it (reference_engine/model/fused_ops.py)."""

    def forward(self, q, k, rope):
        return apply_rope(q, k, rope)


class SiluAndMul(nn.Module):
    """(N, 2I) stacked gate and up -> silu(gate) * up (N, I). A module for the same reason as `Rotary`."""

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # q, k and v in one matmul; the loader fills the three row blocks from q/k/v_proj.
        self.sizes = [self.h * self.d, self.hkv * self.d, self.hkv * self.d]
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.sizes), bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.scale = self.d ** -0.5
        self.rotary = Rotary()

    def forward(self, x, rope: tuple[torch.Tensor, torch.Tensor], backend: AttentionBackend, meta: AttentionMetadata):
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        q = q.reshape(n, self.h, self.d)  # (N, H, D)
        k = k.reshape(n, self.hkv, self.d)  # (N, Hkv, D)
        v = v.reshape(n, self.hkv, self.d)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(q, k, rope)
        o = backend.forward(self.layer_idx, q, k, v, meta, self.scale)  # (N, H, D)
        return self.o_proj(o.reshape(n, self.h * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.sizes = [cfg.intermediate_size, cfg.intermediate_size]  # the loader's row blocks of gate_up_proj
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)  # gate, up stacked
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))  # (N, 2I) -> (N, I) -> (N, hidden)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, rope, backend, meta):
        """(x, residual) -> (mlp output, residual): the stream is residual + x, and that add is left to the
        next norm, which does it in the same pass (`RMSNorm.add`: the same sum, one pass fewer over a
        prefill's (N, hidden) rows). residual is None for the first layer: x is then the stream itself."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            residual, h = self.input_layernorm.add(residual, x)
        residual, h = self.post_attention_layernorm.add(residual, self.self_attn(h, rope, backend, meta))
        return self.mlp(h), residual


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """`forward` returns hidden states `(N, hidden)`; `logits` projects only the rows asked for."""

    def __init__(self, cfg: ModelConfig, max_len: int):
        super().__init__()
        self.cfg = cfg
        self.model = DecoderModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope = RotaryEmbedding(cfg, max_len)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                backend: AttentionBackend, meta: AttentionMetadata) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)  # (N,) -> (N, hidden)
        rope = self.rope(positions, x.dtype)
        residual = None
        for layer in self.model.layers:
            x, residual = layer(x, residual, rope, backend, meta)
        return self.model.norm.add(residual, x)[1]  # the last layer's add, fused into the final norm

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()  # (S, V), sampled in float32 whatever the model dtype
