"""CPU fast path for the decoder's element-wise stages: RMSNorm (and the residual add before the second
norm of a layer, `RMSNorm.add`), rotary embedding, SiLU-and-multiply (inside the gate_up GEMM where its
bf16 panels run on AMX: `FusedMLP`).

`fuse(model)` swaps the model's `RMSNorm`, `Rotary`, `SiluAndMul` and `MLP` modules for ones that call
the one-pass C++ kernels (`kernels/ops.py`: rms_norm, add_rms_norm, rope_, silu_mul; vLLM's CPU backend
has the same three as custom ops). The PyTorch modules stay the readable reference: `fused_ops=False` in
the engine config keeps them, and the fused modules fall back to them for what the kernels do not take (other dtypes,
non-CPU tensors, RMSNorm over a 3-d per-head view as Qwen3's q/k norm).

Invariant: float32 outputs equal the PyTorch modules' up to summation order (RMSNorm's mean) and
the exp approximation (SiLU); the rotary kernel is bit-identical. The fused rotary writes q and k
in place, into the qkv projection's output they are views of; nothing else reads that buffer.
"""
from __future__ import annotations

import torch
from torch import nn

from reference_engine.kernels import ops
from reference_engine.model.llama import MLP, RMSNorm, Rotary, SiluAndMul
from reference_engine.model.packed_linear import PackedLinear

DTYPES = (torch.float32, torch.bfloat16)


def _takes(*ts: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == ts[0].dtype for t in ts) and ts[0].dtype in DTYPES


class FusedRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.stride(1) != 1 or not _takes(x, self.weight):
            return super().forward(x)
        out = torch.empty(x.shape, dtype=x.dtype)
        ops.rms_norm(x, self.weight, self.eps, out)
        return out

    def add(self, x: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() != 2 or x.stride(1) != 1 or not a.is_contiguous() or a.shape != x.shape \
                or not _takes(x, a, self.weight):
            return super().add(x, a)
        total, out = torch.empty(x.shape, dtype=x.dtype), torch.empty(x.shape, dtype=x.dtype)
        ops.add_rms_norm(x, a, self.weight, self.eps, total, out)
        return total, out


class FusedRotary(Rotary):
    def forward(self, q, k, rope):
        cos, sin = rope  # (N, 1, D) each, already in q's dtype
        if not _takes(q, k, cos, sin) or q.stride(2) != 1 or k.stride(2) != 1 \
                or not (cos.is_contiguous() and sin.is_contiguous()):
            return super().forward(q, k, rope)
        ops.rope_(q, cos, sin)
        ops.rope_(k, cos, sin)
        return q, k


class FusedSiluAndMul(SiluAndMul):
    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        if gate_up.dim() != 2 or gate_up.stride(1) != 1 or not _takes(gate_up):
            return super().forward(gate_up)
        out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype)
        ops.silu_mul(gate_up, out)
        return out


class FusedMLP(MLP):
    """The MLP with SiLU-and-multiply in the gate_up GEMM's epilogue where its panels run on AMX
    (`PackedLinear.silu_mul`: the (N, 2I) product is never written); else the module's three steps."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.gate_up_proj
        h = up.silu_mul(x) if isinstance(up, PackedLinear) else None
        return super().forward(x) if h is None else self.down_proj(h)


def _fused_mlp(mlp: MLP) -> FusedMLP:
    f = FusedMLP.__new__(FusedMLP)
    nn.Module.__init__(f)
    f.sizes, f.gate_up_proj, f.down_proj, f.act = mlp.sizes, mlp.gate_up_proj, mlp.down_proj, FusedSiluAndMul()
    return f


def _fused_norm(norm: RMSNorm) -> FusedRMSNorm:
    f = FusedRMSNorm.__new__(FusedRMSNorm)
    nn.Module.__init__(f)
    f.weight, f.eps = norm.weight, norm.eps  # the same parameter: loader names and state stay
    return f


def fuse(model: nn.Module) -> nn.Module:
    """Swap every `RMSNorm`, `Rotary`, `SiluAndMul` and `MLP` of `model` for its fused module, in place."""
    for name, child in list(model.named_children()):
        if type(child) is RMSNorm:
            setattr(model, name, _fused_norm(child))
        elif type(child) is MLP:
            setattr(model, name, _fused_mlp(child))
        elif type(child) is Rotary:
            setattr(model, name, FusedRotary())
        elif type(child) is SiluAndMul:
            setattr(model, name, FusedSiluAndMul())
        else:
            fuse(child)
    return model


def default_on(device: str | torch.device) -> bool:
    """`fused_ops` when the config leaves it None: on, on CPU, where the kernels build."""
    return torch.device(device).type == "cpu" and ops.available()
