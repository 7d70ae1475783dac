"""kernels/cpp_gemm.py: the fp32 GEMM on 32-column panels that PackedLinear takes for SMALL_M + 1 to MID_M
rows (AVX-512 only; elsewhere PackedLinear keeps oneDNN and these tests skip)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reference_engine.model import packed_linear
from reference_engine.kernels import cpp_gemm

pytestmark = pytest.mark.skipif(not cpp_gemm.available(), reason="the C++ GEMM needs a C++ compiler")


def test_pack_lays_w_out_in_k_major_panels_zero_past_n():
    w = torch.arange(40 * 3, dtype=torch.float32).view(40, 3)
    p = cpp_gemm.pack(w)
    assert p.shape == (2, 3, cpp_gemm.NR)
    assert torch.equal(p[1, 2, 7], w[cpp_gemm.NR + 7, 2]) and torch.equal(p[0, 1, :], w[:32, 1])
    assert torch.equal(p[1, :, 8:], torch.zeros(3, 24))  # rows 40..63 do not exist


@pytest.mark.parametrize("n,k", [(1, 1), (17, 5), (32, 64), (100, 300), (960, 576), (576, 1536)])
def test_gemm_agrees_with_a_float64_product_for_every_row_count(n, k):
    torch.manual_seed(n + k)
    w, b = torch.randn(n, k), torch.randn(n)
    p = cpp_gemm.pack(w)
    for rows in (1, 11, 12, 13, 25, 64, 128, 300):  # every tail of the 12-row tile, and several row blocks
        x = torch.randn(rows, k)
        for bias in (None, b):
            got = cpp_gemm.gemm(x, p, n, bias)
            want = F.linear(x.double(), w.double(), None if bias is None else bias.double())
            assert got.shape == (rows, n) and got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * k ** 0.5)


def test_gemm_is_the_k_ordered_fma_chain_bit_for_bit():
    """y[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 0], W[n, 0], 0)): checked against that chain
    computed in float64 with a rounding to float32 after each step (an fma rounds once, as here)."""
    torch.manual_seed(2)
    w, x = torch.randn(45, 300), torch.randn(14, 300)
    acc = torch.zeros(14, 45, dtype=torch.float64)
    for k in range(300):  # a float64 product of two float32 values is exact: one rounding per step
        acc = (acc + x[:, k:k + 1].double() * w[:, k].double()).float().double()
    assert torch.equal(cpp_gemm.gemm(x, cpp_gemm.pack(w), 45, None), acc.float())


def test_gemm_rows_do_not_depend_on_the_batch_nor_the_thread_count():
    torch.manual_seed(3)
    w = torch.randn(3000, 576)
    p, x = cpp_gemm.pack(w), torch.randn(300, 576)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = cpp_gemm.gemm(x[:1], p, 3000, None)
        torch.set_num_threads(max(2, threads))
        for rows in (13, 40, 128, 300):
            assert torch.equal(cpp_gemm.gemm(x[:rows], p, 3000, None)[:1], alone), rows
        assert torch.equal(cpp_gemm.gemm(x[200:213], p, 3000, None), cpp_gemm.gemm(x, p, 3000, None)[200:213])
    finally:
        torch.set_num_threads(threads)


def test_gemm_takes_a_strided_x_and_rejects_what_it_cannot_read():
    torch.manual_seed(5)
    w, x = torch.randn(64, 96), torch.randn(20, 200)
    p = cpp_gemm.pack(w)
    torch.testing.assert_close(cpp_gemm.gemm(x[:, :96], p, 64, None), F.linear(x[:, :96], w), rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="packed \\(P, K, 32\\)"):
        cpp_gemm.gemm(x[:, :96], p, 65, None)  # more columns than the panels hold
    with pytest.raises(RuntimeError, match="float32 rows"):
        cpp_gemm.gemm(x[:, :96].double(), p, 64, None)


def test_packed_linear_takes_the_gemm_between_small_m_and_mid_m_rows(monkeypatch):
    torch.manual_seed(4)
    lin = nn.Linear(64, 40, bias=True)
    packed = packed_linear.PackedLinear(lin, large="onednn", small="inferlab", mid="inferlab")
    assert packed.packed_bytes() == 40 * 64 * 4 + 64 * 64 * 4  # oneDNN's copy and the panels (40 -> 64 columns)
    calls = []
    real = cpp_gemm.gemm
    monkeypatch.setattr(cpp_gemm, "gemm", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    for rows in (1, packed.SMALL_M, packed.SMALL_M + 1, packed.MID_M, packed.MID_M + 1):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(packed(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert calls == [packed.SMALL_M + 1, packed.MID_M]
    off = packed_linear.PackedLinear(lin, mid="onednn")
    assert off.panels is None and off.packed_bytes() == 40 * 64 * 4
    assert packed_linear.PackedLinear(nn.Linear(8, 8).to(torch.bfloat16)).panels is None  # fp32 weights only


def test_mid_gemm_is_chosen_or_pinned(monkeypatch):
    from tests.reference_engine.model.test_packed_linear import _choice_is_pinned_by
    assert packed_linear.mid_gemm() == "inferlab"  # the module is skipped where it cannot be
    _choice_is_pinned_by(packed_linear.mid_gemm, "INFERLAB_MID_GEMM", ("inferlab", "onednn"), monkeypatch)
