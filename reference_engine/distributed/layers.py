"""The row-parallel linear: a rank's slice of the input columns, then one all-reduce of the sum.

Column-parallel layers need no class of their own: a rank's `qkv_proj` and `gate_up_proj` are plain
`nn.Linear`s over its rows (`sharding.ShardPlan.apply` sizes them), so the oneDNN packing
(`packed_linear.pack`) and every backend treat them as any linear. `RowParallelLinear` holds its
weight under the checkpoint's name (`...o_proj.weight`, so the loader fills it like any other) and
adds the all-reduce: each rank's output is a partial sum over its columns, `(N, hidden)`, and the
sum over ranks is the full layer's output. `pack` gives it the same packed GEMM as the plain linears
(`packed_linear.PackedLinear`): fp32 weights then live in its panels only, and `weight` is None.
Invariant: the bias-free partial sums are added exactly once (o_proj and down_proj have no bias).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reference_engine.model.packed_linear import PackedLinear, packable, arena


class RowParallelLinear(nn.Module):
    """`(N, in/size) -> (N, out)` over this rank's input columns, then `all_reduce(y)` in place."""

    def __init__(self, in_features: int, out_features: int, all_reduce):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = None
        self.all_reduce = all_reduce
        self.name = ""  # the layer's place in the model ("layers.0.o_proj"), named by ShardPlan.apply
        self.mm: nn.Module | None = None  # a packed GEMM over `weight`, once `pack` ran

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight) if self.mm is None else self.mm(x)  # (N, out): this rank's partial sum
        if self.all_reduce is not None:
            self.all_reduce(y, self.name)
        return y


def pack(model: nn.Module) -> nn.Module:
    """Give every `RowParallelLinear` of `model` a packed GEMM (CPU), as `packed_linear.pack` does for
    plain linears: one copy of the weight (the panels; on oneDNN's path the parameter stays beside it)."""
    rows = [m for m in model.modules() if isinstance(m, RowParallelLinear) and packable(m.weight)]
    region = arena([m.weight for m in rows])  # their panels on huge pages, as packed_linear.pack's
    for m in rows:
        shell = nn.Linear(1, 1, bias=False, device="meta")
        shell.weight, shell.bias = m.weight, None
        shell.in_features, shell.out_features = m.in_features, m.out_features
        m.mm = PackedLinear(shell, arena=region)
        if m.mm.panels is not None:  # the panels are the one copy: the parameter goes (`mm.weight` unpacks)
            m.register_parameter("weight", None)
    return model
