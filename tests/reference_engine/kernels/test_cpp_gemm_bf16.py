"""cpp_gemm on bf16 pair panels (csrc/linear_bf16.cpp; AMX: csrc/linear_amx.cpp). The pair order: every output is vdpbf16ps' pair order (acc +=
x[2i+1] W[2i+1], then acc += x[2i] W[2i], each product exact in fp32, one rounding per add), + bias in
fp32, one rounding to bf16. The fp32 emulation below is that sequence written out with torch ops (a
product of two bf16 values is exact in fp32, so `acc + x * w` rounds once, as an FMA does); the kernel
must give its bits, with vdpbf16ps (where the CPU has AVX512_BF16) and with the widening FMAs. Inputs
are normal numbers: vdpbf16ps flushes denormals, the FMAs do not (the one documented difference).
Where the CPU has AMX, `gemm` takes it for K % 32 == 0: AMX's own sums (not the pair order), close to the
exact product and batch- and thread-invariant like the others."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reference_engine.kernels import cpp_gemm, ops

pytestmark = pytest.mark.skipif(not ops.available(), reason="the C++ GEMM does not build here")
MODES = ["fma", "vdpbf16ps"]  # the pair order: vdpbf16ps where the CPU has it, else the same widening FMAs
amx_only = pytest.mark.skipif(not ops.available() or not ops.amx_ready(), reason="no AMX on this CPU or build")


def pair_order(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    xf, wf = x.float(), w.float()
    acc = torch.zeros(x.shape[0], w.shape[0])
    for i in range(0, x.shape[1], 2):
        if i + 1 < x.shape[1]:
            acc = acc + xf[:, i + 1:i + 2] * wf[:, i + 1]
        acc = acc + xf[:, i:i + 1] * wf[:, i]
    return (acc if bias is None else acc + bias.float()).to(torch.bfloat16)


def bf16(*shape, g):
    return torch.randn(*shape, generator=g).to(torch.bfloat16)


@pytest.mark.parametrize("path", MODES)
# odd K, N past a panel, odd panel counts; K = 2731: row blocks of 96 (512 KB of packed pairs), 250 rows = 3
@pytest.mark.parametrize("n,k", [(32, 64), (45, 7), (100, 67), (200, 130), (45, 2731)])
def test_the_pair_order_bit_for_bit_in_every_row_regime(path, n, k):
    g = torch.Generator().manual_seed(n * k)
    w, b = bf16(n, k, g=g), bf16(n, g=g)
    p = cpp_gemm.pack(w)
    assert p.shape == (-(-n // 32), -(-k // 2), 32, 2) and p.dtype == torch.bfloat16
    for rows in (1, 5, 6, 7, 13, 49, 250):  # one row, tiles of 6 rows and their tails, 48-row items
        x = bf16(rows, k, g=g)
        for bias in (None, b):
            got = ops.linear_bf16(x, p, n, bias, path)
            assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
            assert torch.equal(got, pair_order(x, w, bias)), (rows, bias is None)
        want = x.double() @ w.double().T  # and close to the exact product: one bf16 rounding at the end
        torch.testing.assert_close(got.double(), want + b.double(), rtol=1e-2, atol=1e-2 * k ** 0.5)


def test_vdpbf16ps_and_the_widening_fmas_agree():
    g = torch.Generator().manual_seed(1)
    w, x = bf16(300, 576, g=g), bf16(20, 576, g=g)
    p = cpp_gemm.pack(w)
    assert torch.equal(ops.linear_bf16(x, p, 300, None, "vdpbf16ps"), ops.linear_bf16(x, p, 300, None, "fma"))
    # linear dispatches: AMX where it runs (K = 576 is a multiple of 32), else the pair order
    assert torch.equal(ops.linear(x, p, 300, None), ops.linear_bf16(x, p, 300, None, cpp_gemm.bf16_path(576)))


@amx_only
@pytest.mark.parametrize("n,k", [(32, 64), (100, 576), (45, 1536)])
def test_amx_is_the_exact_product_rounded_once_more_or_less_in_every_row_regime(n, k):
    g = torch.Generator().manual_seed(n + k)
    w, b = bf16(n, k, g=g), bf16(n, g=g)
    p = cpp_gemm.pack(w)
    assert cpp_gemm.bf16_path(k) == "amx"
    # up to 16 rows: tiles of that many rows; then 32-row blocks, a zero-padded last one; 64-row items
    for rows in (1, 5, 16, 17, 31, 32, 33, 64, 65, 250):
        x = bf16(rows, k, g=g)
        got = ops.linear_bf16(x, p, n, b, "amx")
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
        want = x.double() @ w.double().T + b.double()
        torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2 * k ** 0.5)
        # each fp32 sum within a few ulps of the pair order's: after the bf16 rounding, one step at most
        step = pair_order(x, w, b).double().abs().clamp(min=1e-3) * 2 ** -7
        assert ((got.double() - pair_order(x, w, b).double()).abs() <= step).all(), rows


@amx_only
@pytest.mark.parametrize("inter, k", [(32, 64), (96, 576), (2048, 768)])
def test_the_silu_epilogue_gives_the_gemm_then_silu_mul_bit_for_bit(inter, k):
    """gate_up's GEMM with SiLU-and-multiply in its epilogue (the MLP on AMX) against the GEMM's (M, 2I) output
    through the silu_mul kernel: the same bits at decode, padded-block and prefill row counts, 1 and 2 threads."""
    g = torch.Generator().manual_seed(inter)
    w = bf16(2 * inter, k, g=g)
    p = cpp_gemm.pack(w)
    assert cpp_gemm.silu_fuses(k, 2 * inter) and not cpp_gemm.silu_fuses(k, 2 * inter + 32)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for rows in (1, 9, 33, 300):
                x = bf16(rows, k, g=g) * 4  # both signs of the gate, far into the sigmoid's tails
                want = torch.empty(rows, inter, dtype=torch.bfloat16)
                ops.silu_mul(ops.linear(x, p, 2 * inter, None), want)
                assert torch.equal(ops.linear_silu(x, p, 2 * inter), want), (t, rows)
    finally:
        torch.set_num_threads(threads)


def test_amx_leaves_a_k_that_is_not_a_multiple_of_32_to_the_pair_order():
    g = torch.Generator().manual_seed(4)
    w, x = bf16(64, 80, g=g), bf16(20, 80, g=g)
    p = cpp_gemm.pack(w)
    assert cpp_gemm.bf16_path(80) in ("vdpbf16ps", "fma")
    assert torch.equal(ops.linear_bf16(x, p, 64, None, "amx"), pair_order(x, w, None))


def test_a_row_has_the_same_bits_in_any_batch_and_on_any_thread_count():
    g = torch.Generator().manual_seed(2)
    w, x = bf16(330, 96, g=g), bf16(500, 96, g=g)
    p = cpp_gemm.pack(w)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [ops.linear(x[i:i + 1], p, 330, None) for i in (0, 47, 300)]
        torch.set_num_threads(max(2, threads))
        for rows in (8, 64, 301, 500):
            y = ops.linear(x[:rows], p, 330, None)
            for i, want in zip((0, 47, 300), alone):
                if i < rows:
                    assert torch.equal(y[i:i + 1], want), (rows, i)
    finally:
        torch.set_num_threads(threads)


def test_unpack_and_rows_are_exact_inverses_of_pack():
    g = torch.Generator().manual_seed(3)
    w = bf16(70, 33, g=g)
    p = cpp_gemm.pack(w)
    assert torch.equal(cpp_gemm.unpack(p, 70, 33), w)
    ids = torch.tensor([0, 31, 32, 69, 5])
    assert torch.equal(cpp_gemm.rows(p, ids, 33), w[ids])  # a tied embedding's lookup


def test_rows_that_are_strided_views_and_odd_k_pad_nothing_into_the_sum():
    g = torch.Generator().manual_seed(4)
    w, x = bf16(40, 9, g=g), bf16(10, 12, g=g)[:, :9]  # a view: 12 elements between rows, odd K
    got = ops.linear(x, cpp_gemm.pack(w), 40, None)
    assert torch.equal(got, pair_order(x.contiguous(), w, None))
    w2, x2 = bf16(40, 8, g=g), bf16(10, 11, g=g)[:, :8]  # an odd row stride: pairs would straddle rows
    assert torch.equal(ops.linear(x2, cpp_gemm.pack(w2), 40, None), pair_order(x2.contiguous(), w2, None))


def test_inferlab_amx_0_keeps_every_bf16_product_on_the_pair_order():
    code = ("from reference_engine.kernels import cpp_gemm, ops; "
            "print(ops.amx_ready(), cpp_gemm.bf16_path(576), ops.bf16_native())")
    env = {**os.environ, "INFERLAB_AMX": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    amx, path, native = run.stdout.split()
    assert amx == "False" and path == ("vdpbf16ps" if native == "True" else "fma")
