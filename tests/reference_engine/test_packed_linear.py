"""packed_linear.PackedLinear: oneDNN-packed below LARGE_M rows, from LARGE_M rows on (float32 only)
MKL's F.linear or oneDNN as `prefill_gemm` measured; the same products either way up to summation order."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reference_engine import packed_linear

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="this torch has no oneDNN linear")


@pytest.mark.parametrize("large", ["mkl", "onednn"])
def test_rows_on_either_side_of_large_m_agree_with_f_linear(large):
    torch.manual_seed(0)
    lin = nn.Linear(96, 80, bias=True)
    packed = packed_linear.PackedLinear(lin, large=large)
    for rows in (1, 8, packed.LARGE_M - 1, packed.LARGE_M, 3 * packed.LARGE_M):
        x = torch.randn(rows, 96)
        want = F.linear(x, lin.weight, lin.bias)
        got = packed(x)
        assert got.shape == (rows, 80) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        if rows >= packed.LARGE_M and large == "mkl":  # the large path is F.linear itself: bit for bit
            assert torch.equal(got, want)


def test_bf16_weights_never_take_the_fp32_large_path():
    torch.manual_seed(0)
    lin = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    packed = packed_linear.PackedLinear(lin)
    x = torch.randn(packed.LARGE_M, 64).to(torch.bfloat16)
    got = packed(x)
    assert got.dtype == torch.bfloat16
    want = F.linear(x.float(), lin.weight.float()).to(torch.bfloat16)  # fp32 products of bf16 values
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_prefill_gemm_is_measured_or_pinned(monkeypatch):
    measured = packed_linear.prefill_gemm()
    assert measured in ("mkl", "onednn")
    packed = packed_linear.PackedLinear(nn.Linear(8, 8))
    assert packed.large_mkl == (measured == "mkl")
    for pin in ("mkl", "onednn"):
        monkeypatch.setenv("INFERLAB_PREFILL_GEMM", pin)
        packed_linear.prefill_gemm.cache_clear()
        assert packed_linear.prefill_gemm() == pin
    monkeypatch.setenv("INFERLAB_PREFILL_GEMM", "blas")
    packed_linear.prefill_gemm.cache_clear()
    with pytest.raises(ValueError, match="INFERLAB_PREFILL_GEMM='blas'"):
        packed_linear.prefill_gemm()
    monkeypatch.delenv("INFERLAB_PREFILL_GEMM")
    packed_linear.prefill_gemm.cache_clear()
