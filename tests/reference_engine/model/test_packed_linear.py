"""packed_linear.PackedLinear: oneDNN-packed below LARGE_M rows, from LARGE_M rows on (float32 only)
MKL's F.linear or oneDNN as `prefill_gemm` measured, up to SMALL_M rows (float32 only) the C++ GEMV of
kernels/cpp_gemv.py; the same products every way up to summation order."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reference_engine.model import packed_linear

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


def _choice_is_pinned_by(choose, env: str, kinds: tuple[str, str], monkeypatch) -> None:
    for pin in kinds:
        monkeypatch.setenv(env, pin)
        choose.cache_clear()
        assert choose() == pin
    monkeypatch.setenv(env, "blas")
    choose.cache_clear()
    with pytest.raises(ValueError, match=f"{env}='blas'"):
        choose()
    monkeypatch.delenv(env)
    choose.cache_clear()


def test_prefill_gemm_is_measured_or_pinned(monkeypatch):
    measured = packed_linear.prefill_gemm()
    assert measured in ("mkl", "onednn")
    packed = packed_linear.PackedLinear(nn.Linear(8, 8))
    assert packed.large_mkl == (measured == "mkl")
    _choice_is_pinned_by(packed_linear.prefill_gemm, "INFERLAB_PREFILL_GEMM", ("mkl", "onednn"), monkeypatch)


# --- the decode-sized kernel (kernels/cpp_gemv.py): fp32 products of at most SMALL_M rows ----------

gemv_builds = pytest.mark.skipif(packed_linear.decode_gemv() != "inferlab", reason="the C++ GEMV does not build here")


@gemv_builds
@pytest.mark.parametrize("n,k", [(8, 1), (13, 7), (96, 64), (100, 576), (960, 576), (576, 1536)])
def test_gemv_agrees_with_a_float64_product_for_every_row_count(n, k):
    from reference_engine.kernels import cpp_gemv
    torch.manual_seed(n + k)
    w, b = torch.randn(n, k), torch.randn(n)
    for rows in (1, 2, 3, 4, 5, 8, 9, 17):
        x = torch.randn(rows, k)
        for bias in (None, b):
            got = cpp_gemv.gemv(x, w, bias)
            want = F.linear(x.double(), w.double(), None if bias is None else bias.double())
            assert got.shape == (rows, n) and got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * k ** 0.5)


@gemv_builds
def test_gemv_is_exact_where_every_partial_sum_is_representable():
    from reference_engine.kernels import cpp_gemv
    g = torch.Generator().manual_seed(1)
    w = torch.randint(-8, 9, (40, 300), generator=g).float()
    x = torch.randint(-8, 9, (3, 300), generator=g).float()
    assert torch.equal(cpp_gemv.gemv(x, w, None), (x.double() @ w.double().T).float())  # |sums| < 2^24


@gemv_builds
def test_gemv_rows_do_not_depend_on_the_batch_nor_the_thread_count():
    """Each output is one fixed sequence of roundings, whatever the batch and however threads split W."""
    from reference_engine.kernels import cpp_gemv
    torch.manual_seed(3)
    w = torch.randn(3000, 576)
    x = torch.randn(12, 576)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [cpp_gemv.gemv(x[i:i + 1], w, None) for i in range(12)]
        torch.set_num_threads(max(2, threads))
        for rows in (2, 3, 5, 8, 12):
            batched = cpp_gemv.gemv(x[:rows], w, None)
            for i in range(rows):
                assert torch.equal(batched[i:i + 1], alone[i]), (rows, i)
    finally:
        torch.set_num_threads(threads)


@gemv_builds
def test_gemv_takes_a_strided_x_and_rejects_what_it_cannot_read():
    from reference_engine.kernels import cpp_gemv
    torch.manual_seed(5)
    w, x = torch.randn(64, 96), torch.randn(4, 200)
    torch.testing.assert_close(cpp_gemv.gemv(x[:, :96], w, None), F.linear(x[:, :96], w), rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="W \\(N, K\\) float32, contiguous"):
        cpp_gemv.gemv(x[:, :96], w.t().contiguous().t(), None)
    with pytest.raises(RuntimeError, match="float32 rows"):
        cpp_gemv.gemv(x[:, :96].double(), w, None)


@gemv_builds
def test_packed_linear_takes_the_kernel_up_to_small_m_rows_only(monkeypatch):
    torch.manual_seed(4)
    lin = nn.Linear(64, 40, bias=True)
    packed = packed_linear.PackedLinear(lin, large="onednn", mid="onednn")
    assert packed.small_gemv and packed.packed_bytes() == 40 * 64 * 4  # the GEMV adds no copy to oneDNN's
    from reference_engine.kernels import cpp_gemv
    calls = []
    real = cpp_gemv.gemv
    monkeypatch.setattr(cpp_gemv, "gemv", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    for rows in (1, packed.SMALL_M, packed.SMALL_M + 1):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(packed(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert calls == [1, packed.SMALL_M]
    assert not packed_linear.PackedLinear(nn.Linear(8, 8).to(torch.bfloat16)).small_gemv  # fp32 weights only
    assert not packed_linear.PackedLinear(lin, small="onednn").small_gemv


def test_decode_gemv_is_chosen_or_pinned(monkeypatch):
    assert packed_linear.decode_gemv() in ("inferlab", "onednn")
    from reference_engine.kernels import cpp_gemv
    can = ("inferlab", "onednn") if cpp_gemv.available() else ("onednn",)  # an impossible pin is refused
    _choice_is_pinned_by(packed_linear.decode_gemv, "INFERLAB_DECODE_GEMV", can, monkeypatch)


def test_the_mid_gemm_is_on_exactly_where_its_kernel_runs():
    """AVX-512 with a compiler: the C++ GEMM and its panels; anywhere else oneDNN and no third copy."""
    from reference_engine.kernels import cpp_gemm
    want = "inferlab" if cpp_gemm.available() else "onednn"
    assert packed_linear.mid_gemm() == want
    packed = packed_linear.PackedLinear(nn.Linear(64, 40))
    assert (packed.panels is not None) == (want == "inferlab")
    x = torch.randn(packed.SMALL_M + 5, 64)
    torch.testing.assert_close(packed(x), F.linear(x, packed.weight, packed.bias), rtol=1e-5, atol=1e-5)
