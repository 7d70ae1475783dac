"""packed_linear.PackedLinear: oneDNN-packed below LARGE_M rows, MKL's F.linear from LARGE_M rows on
(float32 only), the same products either way up to summation order."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reference_engine import packed_linear

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="this torch has no oneDNN linear")


def test_rows_on_either_side_of_large_m_agree_with_f_linear():
    torch.manual_seed(0)
    lin = nn.Linear(96, 80, bias=True)
    packed = packed_linear.PackedLinear(lin)
    for rows in (1, 8, packed.LARGE_M - 1, packed.LARGE_M, 3 * packed.LARGE_M):
        x = torch.randn(rows, 96)
        want = F.linear(x, lin.weight, lin.bias)
        got = packed(x)
        assert got.shape == (rows, 80) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        if rows >= packed.LARGE_M:  # the large path is F.linear itself: bit for bit
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
