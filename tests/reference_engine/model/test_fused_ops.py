"""The fused CPU element-wise modules (fused_ops.py) against the PyTorch modules they replace."""
from __future__ import annotations

import os

import pytest
import torch

from reference_engine.config import EngineConfig
from reference_engine.kernels import ops
from reference_engine.model import fused_ops
from reference_engine.model.llama import RMSNorm, Rotary, SiluAndMul

if not ops.available():
    if os.environ.get("CI"):  # `make setup` builds it there: its absence is a failure, not a skip
        pytest.fail("the CPU element-wise kernels did not build although `make setup` builds them", pytrace=False)
    pytest.skip("the CPU kernels do not build here (no C++ compiler with OpenMP)", allow_module_level=True)

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@DTYPES
@pytest.mark.parametrize("rows, hidden", [(1, 256), (7, 100), (300, 768)])  # 100: a scalar tail after 8-wide
def test_rms_norm(rows, hidden, dtype):
    g = torch.Generator().manual_seed(rows)
    ref = RMSNorm(hidden, 1e-6)
    ref.weight.data = torch.randn(hidden, generator=g).to(dtype)
    fused = fused_ops.fuse(torch.nn.Sequential(ref))[0]
    assert type(fused) is fused_ops.FusedRMSNorm and fused.weight is ref.weight  # the same parameter
    wide = torch.randn(rows, hidden + 24, generator=g).to(dtype) * 3
    x = wide[:, 5:5 + hidden]  # rows with a stride, as a slice of a wider activation
    out = fused(x)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel(out, RMSNorm.forward(fused, x)) < (1e-6 if dtype == torch.float32 else 8e-3)


@DTYPES
@pytest.mark.parametrize("rows, hidden", [(1, 256), (7, 100), (300, 768)])
def test_the_residual_add_before_a_norm_is_the_add_then_the_norm(rows, hidden, dtype):
    """`add` (the attention's residual, then the layer's second norm) in one pass: the sum bit for bit as
    PyTorch's add (rounded to the dtype), the norm bit for bit as the fused norm of that sum."""
    g = torch.Generator().manual_seed(hidden)
    ref = RMSNorm(hidden, 1e-6)
    ref.weight.data = torch.randn(hidden, generator=g).to(dtype)
    fused = fused_ops.fuse(torch.nn.Sequential(ref))[0]
    x, a = torch.randn(rows, hidden, generator=g).to(dtype) * 3, torch.randn(rows, hidden, generator=g).to(dtype)
    total, normed = fused.add(x, a)
    want_total, want_normed = ref.add(x, a)  # the PyTorch modules
    assert total.dtype == dtype and torch.equal(total, want_total)
    assert torch.equal(normed, fused(x + a))
    assert rel(normed, want_normed) < (1e-6 if dtype == torch.float32 else 8e-3)


@DTYPES
def test_rms_norm_falls_back_for_per_head_views(dtype):
    """Qwen3's q/k norms normalise a (N, heads, D) view: the PyTorch code serves, same result."""
    norm = fused_ops.fuse(torch.nn.Sequential(RMSNorm(32, 1e-6)))[0]
    x = torch.randn(5, 4, 32).to(dtype)
    assert torch.equal(norm(x), RMSNorm.forward(norm, x))


@DTYPES
@pytest.mark.parametrize("rows, inter", [(1, 64), (9, 100), (130, 2048)])
def test_silu_and_mul(rows, inter, dtype):
    gu = (torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(inter)) * 6).to(dtype)  # both tails
    out = fused_ops.FusedSiluAndMul()(gu)
    ref = SiluAndMul()(gu)
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel(out, ref) < (1e-6 if dtype == torch.float32 else 8e-3)


@DTYPES
@pytest.mark.parametrize("heads, kv_heads, d", [(8, 2, 32), (12, 4, 64), (3, 3, 12), (4, 2, 48)])  # 16, 8 lanes, scalar
def test_rotary_in_place_on_qkv_views_is_bit_identical(heads, kv_heads, d, dtype):
    n = 11
    g = torch.Generator().manual_seed(d)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=g).to(dtype)
    cos = torch.randn(n, 1, d, generator=g).to(dtype)
    sin = torch.randn(n, 1, d, generator=g).to(dtype)

    def views(t):
        q, k, v = t.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        return q.reshape(n, heads, d), k.reshape(n, kv_heads, d), v

    q_ref, k_ref = Rotary()(*views(qkv.clone())[:2], (cos, sin))
    q, k, v = views(qkv)
    v_before = v.clone()
    q2, k2 = fused_ops.FusedRotary()(q, k, (cos, sin))
    assert q2.data_ptr() == q.data_ptr()  # written in place into the qkv buffer
    assert torch.equal(q2, q_ref) and torch.equal(k2, k_ref)
    assert torch.equal(v, v_before)  # v, between and beside them, untouched


def test_other_dtypes_fall_back():
    gu = torch.randn(3, 16, dtype=torch.float16)
    assert torch.equal(fused_ops.FusedSiluAndMul()(gu), SiluAndMul()(gu))


def test_on_by_default_on_cpu_and_off_with_one_setting(tmp_path):
    from reference_engine.model.make import make_model
    from reference_engine.worker.backends import with_default_backends
    from reference_engine.worker.model_runner import ModelRunner

    assert with_default_backends(EngineConfig("m")).fused_ops is True
    with pytest.raises(ValueError, match="fused_ops must be a bool"):
        EngineConfig("m", fused_ops="yes")
    make_model(tmp_path / "m", preset="tiny", family="llama", seed=0)
    on = ModelRunner(EngineConfig(str(tmp_path / "m"), kv_cache_tokens=64)).model
    off = ModelRunner(EngineConfig(str(tmp_path / "m"), kv_cache_tokens=64, fused_ops=False)).model
    kinds = lambda m: {type(x).__name__ for x in m.modules()}  # noqa: E731
    assert {"FusedRMSNorm", "FusedRotary", "FusedSiluAndMul"} <= kinds(on)
    assert not {"FusedRMSNorm", "FusedRotary", "FusedSiluAndMul"} & kinds(off)
    assert on.state_dict().keys() == off.state_dict().keys()


def test_the_mlp_multiplies_silu_inside_the_gemm_on_amx_with_the_modules_bits():
    """`FusedMLP`: where bf16 panels run on AMX, SiLU-and-multiply is gate_up's epilogue; the hidden states are
    the three-step module's bit for bit. Elsewhere (fp32, no AMX) it is the three steps."""
    from types import SimpleNamespace

    from reference_engine.model import packed_linear
    from reference_engine.model.llama import MLP
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        holder = torch.nn.Sequential(MLP(SimpleNamespace(hidden_size=64, intermediate_size=96)).to(dtype))
        packed_linear.pack(holder)
        fused_ops.fuse(holder)
        mlp = holder[0]
        assert type(mlp) is fused_ops.FusedMLP
        x = torch.randn(37, 64).to(dtype)
        takes = mlp.gate_up_proj.silu_mul(x) is not None
        assert takes == (dtype == torch.bfloat16 and ops.amx_ready())
        assert torch.equal(mlp(x), MLP.forward(mlp, x))  # the three steps, the same modules
