"""The CPU decode fast path: an all-decode step runs each decoder layer as one C++ call.

At batch 1 a decode step is a read of the weights plus ~15 small ops per layer; on SmolLM2 those ops'
Python, nn.Module and dispatcher overhead was ~5 ms of a ~17-20 ms step. Up to `PackedLinear.MID_M`
rows the call takes the panel GEMM (kernels/cpp_gemm.py) on each projection's one copy, fp32 or bf16
(bf16 pair panels). On the oneDNN fallback (INFERLAB_LINEAR=onednn) bf16 weights multiplied natively take
it too, every product then oneDNN's packed linear called from C++ as PackedLinear calls it from Python. `FusedDecode.forward` runs the
embedding and the final norm as the model does and every layer through
`kernels/ops.decode_layer`: the same kernels in the same order as `DecoderLayer.forward` with the
fused modules, PackedLinear's products and the CPU attention backend, so the hidden states are
bit-identical (tests/reference_engine/model/test_fused_decode.py). The model's modules stay the readable
reference and serve every other step (prefill, mixed, larger batches, spec verification).

Taken when (`FusedDecode.build` returns None otherwise): CPU, the fused element-wise modules
(`fused_ops`), every projection a `PackedLinear` (on the panels, fp32 or bf16; on oneDNN: bf16
multiplied in bf16), the CPU attention backend, no q/k norm (Qwen3), no tensor parallelism, and the kernels
build (`ops.available`); per step (`takes`): every row is one decoding sequence and there are at most
`MID_M` of them. Module hooks do not fire on it:
`INFERLAB_FUSED_DECODE=0` turns it off for a session that hooks the layers (scripts/stage_times.py,
removed after commit f9c2189); `1` (the default) leaves it where it applies; anything else is refused
at start (`pin_problems`).
"""
from __future__ import annotations

import os

import torch

from reference_engine.model import fused_ops
from reference_engine.attention.cpu_backend import CpuBackend
from reference_engine.kernels import ops
from reference_engine.model.llama import CausalLM
from reference_engine.model.packed_linear import PackedLinear


class FusedDecode:
    def __init__(self, model: CausalLM, backend: CpuBackend):
        self.model, self.backend = model, backend
        cfg = model.cfg
        self.heads, self.kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.scale = cfg.head_dim ** -0.5
        empty = torch.empty(0)
        # the oneDNN fallback (bf16 multiplied natively): every product is oneDNN's, on its packed copies
        onednn = model.model.layers[0].self_attn.qkv_proj.panels is None
        # per layer, in decode_layer's argument order: ln1, ln2, eps, the four projections' one copy (the
        # panels, fp32 or bf16; on the fallback oneDNN's packed weights), b_qkv, their output widths, which
        self.args = []
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            bias = a.qkv_proj.bias if a.qkv_proj.bias is not None else empty  # PackedLinear's, in its compute dtype
            projections = (a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj)
            mats = [p.packed if onednn else p.panels for p in projections]
            self.args.append((layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                              layer.input_layernorm.eps, mats, bias, [p.out_features for p in projections], onednn))
        self.max_rows = PackedLinear.MID_M

    # The model features the layer kernel implements; any other value is refused by name (`refusal`), so a
    # feature added to the model later is served by the modules until the kernel learns it.
    SUPPORTS = {"family": ("llama", "qwen2"),  # qwen2: a bias on the qkv projection
                "qk_norm": (False,)}  # Qwen3's per-head q/k RMSNorm is not in the kernel
    DTYPES = (torch.float32, torch.bfloat16)

    @classmethod
    def refusal(cls, model: CausalLM, backend, tp) -> str | None:
        """Why the fast path does not apply to this model and backend, in words naming the input; None
        where it does. What it supports: CPU attention backend, fp32 (panels) or natively multiplied bf16
        weights, the fused element-wise modules, the `SUPPORTS` model features, one rank, kernels that build."""
        if os.environ.get("INFERLAB_FUSED_DECODE", "1") == "0":
            return "INFERLAB_FUSED_DECODE=0"
        if tp:
            return "tensor parallelism (the layer kernel has no all-reduce)"
        for feature, ok in cls.SUPPORTS.items():
            if getattr(model.cfg, feature) not in ok:
                return f"model {feature}={getattr(model.cfg, feature)!r} (the layer kernel supports {ok})"
        dtype = next(model.parameters()).dtype
        if type(backend) is not CpuBackend:
            return f"attention backend {type(backend).__name__} (the layer kernel reads the CPU backend's cache)"
        if dtype not in cls.DTYPES:
            return f"dtype {dtype} (the layer kernel takes float32 and bfloat16)"
        layers = model.model.layers
        linears = [m for layer in layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                   layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        if not all(isinstance(m, PackedLinear) for m in linears):
            return "projections not packed (linear_backend is not onednn)"
        if dtype == torch.float32 and not all(m.panels is not None for m in linears):
            return "fp32 projections on oneDNN (INFERLAB_LINEAR=onednn, or no panel kernel)"
        if dtype == torch.bfloat16 and not all(m.compute_dtype == torch.bfloat16 for m in linears):
            return "bf16 weights multiplied in fp32 (no native bf16 here): the modules' casts stay in Python"
        if not all(isinstance(layer.input_layernorm, fused_ops.FusedRMSNorm) for layer in layers):
            return "fused element-wise ops off"
        if not ops.available():
            return "the C++ kernels do not build here"
        return None

    @classmethod
    def build(cls, model: CausalLM, backend, tp) -> FusedDecode | None:
        """The fast path for this model and backend, or None where it does not apply (`refusal`)."""
        return None if cls.refusal(model, backend, tp) else cls(model, backend)

    def takes(self, batch) -> bool:
        """Is this step all decodes (one row per sequence), and few enough rows?"""
        n = batch.input_ids.shape[0]
        return 0 < n <= self.max_rows and batch.meta.num_decodes == n

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> torch.Tensor:
        """(N,) ids of N decoding sequences -> final hidden states (N, hidden), as `CausalLM.forward`."""
        model = self.model
        x = model.model.embed_tokens(input_ids)  # (N, hidden)
        cos, sin = model.rope(positions, x.dtype)  # (N, 1, D) each
        tables, lens, _ = self.backend._step_plan(meta)
        n = x.shape[0]
        tables, lens, slots = tables[:n], lens[:n], meta.slot_mapping
        for i, args in enumerate(self.args):
            k_cache, v_cache = self.backend.kv[i]
            x = ops.decode_layer(x, *args, self.heads, self.kv_heads, self.scale, cos, sin, k_cache, v_cache, slots,
                                 tables, lens)
        return model.model.norm(x)


def pin_problems() -> list[str]:
    """Why `INFERLAB_FUSED_DECODE` as set cannot be honoured ("0" or "1": another value, such as
    "false", would otherwise leave the path on without a word)."""
    v = os.environ.get("INFERLAB_FUSED_DECODE", "1")
    return [] if v in ("0", "1") else [f"INFERLAB_FUSED_DECODE={v!r}: expected '0' (off) or '1' (where it applies)"]
