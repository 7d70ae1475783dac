"""The CPU decode fast path: an all-decode step runs each decoder layer as one C++ call.

At batch 1..`PackedLinear.SMALL_M` a decode step is a read of the weights (the GEMVs) plus ~15
small ops per layer; at batch 1 on SmolLM2 those ops' Python, nn.Module and dispatcher overhead was
~5 ms of a ~17-20 ms step. Up to `PackedLinear.MID_M` rows, where the projections have the C++
GEMM's panels (kernels/cpp_gemm.py), the same call takes the GEMM for them (64 rows: ~3 ms a step).
bf16 weights on a CPU that multiplies bf16 natively take it too, every product then oneDNN's packed
linear called from C++ as PackedLinear calls it from Python. `FusedDecode.forward` runs the
embedding and the final norm as the model does and every layer through
`kernels/cpp_decode_layer.py`: the same kernels in the same order as `DecoderLayer.forward` with the
fused modules, PackedLinear's products and the CPU attention backend, so the hidden states are
bit-identical (tests/reference_engine/model/test_fused_decode.py). The model's modules stay the readable
reference and serve every other step (prefill, mixed, larger batches, spec verification).

Taken when (`FusedDecode.build` returns None otherwise): CPU, the fused element-wise modules
(`fused_ops`), every projection a `PackedLinear` (fp32 weights: on the C++ GEMV; bf16: multiplied
in bf16), the CPU attention backend, no q/k norm (Qwen3), no tensor parallelism, and the kernel
builds; per step (`takes`): every row is one decoding sequence and there are at most `SMALL_M` of
them (`MID_M` where every projection has panels, and in bf16). Module hooks do not fire on it:
`INFERLAB_FUSED_DECODE=0` turns it off for a session that hooks the layers (scripts/stage_times.py); `1`
(the default) leaves it where it applies; anything else is refused at start (`pin_problems`).
"""
from __future__ import annotations

import functools
import os

import torch

from reference_engine.model import fused_ops
from reference_engine.attention.cpu_backend import CpuBackend
from reference_engine.kernels import cpp_decode_layer, cpu_build
from reference_engine.model.llama import CausalLM
from reference_engine.model.packed_linear import PackedLinear


class FusedDecode:
    def __init__(self, model: CausalLM, backend: CpuBackend):
        self.model, self.backend = model, backend
        cfg = model.cfg
        self.heads, self.kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.scale = cfg.head_dim ** -0.5
        empty = torch.empty(0)
        # bf16 weights multiplied natively: every product is oneDNN's, on PackedLinear's packed copies
        onednn = next(model.parameters()).dtype == torch.bfloat16
        # per layer, in decode_layer's argument order: ln1, ln2, eps, W_qkv, b_qkv, W_o, W_gate_up, W_down,
        # the four projections' second operand (fp32: the GEMM's panels, empty where PackedLinear has
        # none; bf16: oneDNN's packed weights), SMALL_M and which of the two
        self.args = []
        panelled = True
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            bias = a.qkv_proj.bias if a.qkv_proj.bias is not None else empty  # PackedLinear's, in its compute dtype
            projections = (a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj)
            mats = [p.packed if onednn else p.panels if p.panels is not None else empty for p in projections]
            panelled &= all(p.panels is not None for p in projections)
            self.args.append((layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                              layer.input_layernorm.eps, a.qkv_proj.weight.detach(), bias, a.o_proj.weight.detach(),
                              m.gate_up_proj.weight.detach(), m.down_proj.weight.detach(), mats,
                              PackedLinear.SMALL_M, onednn))
        self.max_rows = PackedLinear.MID_M if panelled or onednn else PackedLinear.SMALL_M

    @classmethod
    def build(cls, model: CausalLM, backend, tp) -> FusedDecode | None:
        """The fast path for this model and backend, or None where it does not apply (module docstring)."""
        if os.environ.get("INFERLAB_FUSED_DECODE", "1") == "0" or tp or model.cfg.qk_norm:
            return None
        dtype = next(model.parameters()).dtype
        if type(backend) is not CpuBackend or dtype not in (torch.float32, torch.bfloat16):
            return None
        layers = model.model.layers
        linears = [m for layer in layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                   layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        if not all(isinstance(m, PackedLinear) for m in linears):
            return None
        if dtype == torch.float32 and not all(m.small_gemv for m in linears):
            return None
        if dtype == torch.bfloat16 and not all(m.compute_dtype == torch.bfloat16 for m in linears):
            return None  # bf16 multiplied in fp32 (no native bf16): the modules' casts stay in Python
        if not all(isinstance(layer.input_layernorm, fused_ops.FusedRMSNorm) for layer in layers):
            return None
        if not available():
            return None
        return cls(model, backend)

    def takes(self, batch) -> bool:
        """Is this step all decodes (one row per sequence), and few enough rows?"""
        n = batch.input_ids.shape[0]
        return 0 < n <= self.max_rows and batch.meta.num_decodes == n

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> torch.Tensor:
        """(N,) ids of N decoding sequences -> final hidden states (N, hidden), as `CausalLM.forward`."""
        model, run = self.model, cpp_decode_layer.module().decode_layer
        x = model.model.embed_tokens(input_ids)  # (N, hidden)
        cos, sin = model.rope(positions, x.dtype)  # (N, 1, D) each
        tables, lens, _ = self.backend._step_plan(meta)
        n = x.shape[0]
        tables, lens, slots = tables[:n], lens[:n], meta.slot_mapping
        for i, args in enumerate(self.args):
            k_cache, v_cache = self.backend.kv[i]
            x = run(x, *args, self.heads, self.kv_heads, self.scale, cos, sin, k_cache, v_cache, slots, tables, lens)
        return model.model.norm(x)


def pin_problems() -> list[str]:
    """Why `INFERLAB_FUSED_DECODE` as set cannot be honoured ("0" or "1": another value, such as
    "false", would otherwise leave the path on without a word)."""
    v = os.environ.get("INFERLAB_FUSED_DECODE", "1")
    return [] if v in ("0", "1") else [f"INFERLAB_FUSED_DECODE={v!r}: expected '0' (off) or '1' (where it applies)"]


@functools.cache
def available() -> bool:
    """Does the layer kernel build and load here? (cpu_build.builds: a C++ compiler with OpenMP is needed)"""
    return cpu_build.builds(cpp_decode_layer.module)
