"""kernels/cpp_gemm.py's 32-column panels, W's one resident copy, and the fp32 GEMM on them (ops.linear)
that PackedLinear takes for every row count (AVX-512, AVX2 + FMA or scalar: tests/reference_engine/kernels/
test_isa.py runs these on each build this CPU executes)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from reference_engine.kernels import cpp_gemm, ops

pytestmark = pytest.mark.skipif(not ops.available(), reason="the C++ GEMM needs a C++ compiler")


def test_pack_lays_w_out_in_k_major_panels_zero_past_n():
    w = torch.arange(40 * 3, dtype=torch.float32).view(40, 3)
    p = cpp_gemm.pack(w)
    assert p.shape == (2, 3, cpp_gemm.NR)
    assert torch.equal(p[1, 2, 7], w[cpp_gemm.NR + 7, 2]) and torch.equal(p[0, 1, :], w[:32, 1])
    assert torch.equal(p[1, :, 8:], torch.zeros(3, 24))  # rows 40..63 do not exist


def test_rows_gathers_exact_rows_from_the_panels_and_refuses_an_id_past_them():
    w = torch.randn(70, 9)
    p = cpp_gemm.pack(w)
    ids = torch.tensor([0, 31, 32, 69, 5, 5])
    assert torch.equal(cpp_gemm.rows(p, ids, 9), w[ids])  # a tied embedding's lookup
    with pytest.raises(RuntimeError, match="out of range"):
        cpp_gemm.rows(p, torch.tensor([96]), 9)  # past the last panel's 32 columns


@pytest.mark.parametrize("n,k", [(1, 1), (17, 5), (32, 64), (100, 300), (960, 576), (576, 1536)])
def test_gemm_agrees_with_a_float64_product_for_every_row_count(n, k):
    torch.manual_seed(n + k)
    w, b = torch.randn(n, k), torch.randn(n)
    p = cpp_gemm.pack(w)
    for rows in (1, 11, 12, 13, 25, 64, 128, 300):  # every tail of the 12-row tile; row blocks at K = 1536 (84 rows)
        x = torch.randn(rows, k)
        for bias in (None, b):
            got = ops.linear(x, p, n, bias)
            want = F.linear(x.double(), w.double(), None if bias is None else bias.double())
            assert got.shape == (rows, n) and got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * k ** 0.5)


def test_gemm_is_the_k_ordered_fma_chain_bit_for_bit():
    """y[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 0], W[n, 0], 0)): checked against that chain
    computed in float64 with a rounding to float32 after each step (an fma rounds once, as here)."""
    torch.manual_seed(2)
    # N = 100: 3 whole panels and a narrow one, so a prefill's 2-panel tiles meet an odd and a narrow panel
    w, x = torch.randn(100, 300), torch.randn(450, 300)  # 450 rows: past one block (432 rows at K = 300)
    acc = torch.zeros(450, 100, dtype=torch.float64)
    for k in range(300):  # a float64 product of two float32 values is exact: one rounding per step
        acc = (acc + x[:, k:k + 1].double() * w[:, k].double()).float().double()
    for rows in (1, 14, 200, 450):  # the 12-row tiles (decode), the 6-row 2-panel tiles (>= 192 rows)
        assert torch.equal(ops.linear(x[:rows], cpp_gemm.pack(w), 100, None), acc[:rows].float()), rows


def test_gemm_rows_do_not_depend_on_the_batch_nor_the_thread_count():
    torch.manual_seed(3)
    w = torch.randn(3000, 576)
    p, x = cpp_gemm.pack(w), torch.randn(300, 576)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = ops.linear(x[:1], p, 3000, None)
        torch.set_num_threads(max(2, threads))
        for rows in (13, 40, 128, 300):
            assert torch.equal(ops.linear(x[:rows], p, 3000, None)[:1], alone), rows
        assert torch.equal(ops.linear(x[200:213], p, 3000, None), ops.linear(x, p, 3000, None)[200:213])
    finally:
        torch.set_num_threads(threads)


def test_gemm_takes_a_strided_x_and_rejects_what_it_cannot_read():
    torch.manual_seed(5)
    w, x = torch.randn(64, 96), torch.randn(20, 200)
    p = cpp_gemm.pack(w)
    torch.testing.assert_close(ops.linear(x[:, :96], p, 64, None), F.linear(x[:, :96], w), rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="packed \\(P, K, 32\\)"):
        ops.linear(x[:, :96], p, 65, None)  # more columns than the panels hold
    with pytest.raises(RuntimeError, match="float32 rows"):
        ops.linear(x[:, :96].double(), p, 64, None)


def test_unpack_is_packs_inverse():
    w = torch.randn(45, 7)
    assert torch.equal(cpp_gemm.unpack(cpp_gemm.pack(w), 45), w)
