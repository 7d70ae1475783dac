"""packed_linear.PackedLinear: fp32 and bf16 weights held once, as the C++ GEMM's panels, serving every
row count with the same bits per row (a decode step, a decode batch and a prefill agree); tied embeddings
read the LM head's panels; the oneDNN fallback (INFERLAB_LINEAR=onednn) as before."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reference_engine.kernels import ops
from reference_engine.model import packed_linear
from reference_engine.model.packed_linear import PackedLinear, PanelEmbedding

pytestmark = pytest.mark.skipif(not packed_linear.onednn_available(), reason="this torch has no oneDNN linear")
panels = pytest.mark.skipif(packed_linear.linear_kernel() != "inferlab", reason="the C++ GEMM does not build here")


@panels
@pytest.mark.parametrize("n,k", [(8, 1), (45, 7), (96, 64), (100, 576)])
def test_every_row_count_agrees_with_a_float64_product(n, k):
    torch.manual_seed(n + k)
    lin = nn.Linear(k, n, bias=True)
    packed = PackedLinear(lin)
    for rows in (1, 5, 12, 13, 128, 241, 600):  # the GEMV's, the decode batch's and prefill's counts; MB = 240
        x = torch.randn(rows, k)
        want = F.linear(x.double(), lin.weight.double(), lin.bias.double())
        got = packed(x)
        assert got.shape == (rows, n) and got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * k ** 0.5)
    assert packed(torch.randn(2, 3, k)).shape == (2, 3, n)  # (..., in) -> (..., out)


@panels
def test_a_row_has_the_same_bits_in_every_regime_and_on_any_thread_count():
    """One k-order FMA chain per output: a decode step, a decode batch and a prefill chunk give a
    sequence's row the same bits, however many threads split the panels."""
    torch.manual_seed(3)
    packed = PackedLinear(nn.Linear(576, 1000, bias=False))
    x = torch.randn(700, 576)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [packed(x[i:i + 1]) for i in (0, 11, 250)]
        torch.set_num_threads(max(2, threads))
        for rows in (12, 64, 300, 700):
            y = packed(x[:rows])
            for i, want in zip((0, 11, 250), alone):
                if i < rows:
                    assert torch.equal(y[i:i + 1], want), (rows, i)
    finally:
        torch.set_num_threads(threads)


@panels
def test_one_copy_is_held_and_weight_unpacks_it_on_demand():
    torch.manual_seed(5)
    lin = nn.Linear(64, 40, bias=True)
    packed = PackedLinear(lin)
    assert packed.packed is None and list(packed.parameters()) == []  # no parameter, no oneDNN copy
    assert packed.packed_bytes() == 2 * 64 * 32 * 4  # 40 columns in two 32-column panels
    assert torch.equal(packed.weight, lin.weight.detach()) and packed.weight.data_ptr() != packed.weight.data_ptr()
    assert torch.equal(packed.bias, lin.bias.detach()) and [n for n, _ in packed.named_buffers()] == ["bias"]
    assert packed_linear.layout_bytes(nn.Sequential(packed)) == {"panels": packed.packed_bytes()}


@panels
def test_a_tied_embedding_reads_the_lm_heads_panels():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.cfg = type("Cfg", (), {"tie_word_embeddings": True})()
            self.model = nn.Module()
            self.model.embed_tokens = nn.Embedding(70, 16)
            self.lm_head = nn.Linear(16, 70, bias=False)
            self.lm_head.weight = self.model.embed_tokens.weight

    torch.manual_seed(6)
    m = Tied()
    table = m.model.embed_tokens.weight.detach().clone()
    packed_linear.pack(m)
    assert isinstance(m.model.embed_tokens, PanelEmbedding) and list(m.parameters()) == []  # stored once
    ids = torch.tensor([[0, 31, 32], [69, 5, 64]])
    assert torch.equal(m.model.embed_tokens(ids), table[ids])


@panels
def test_bf16_weights_are_held_once_as_pair_panels():
    torch.manual_seed(0)
    lin = nn.Linear(65, 48, bias=True).to(torch.bfloat16)
    packed = PackedLinear(lin, kernel="inferlab")
    assert packed.packed is None and list(packed.parameters()) == [] and packed.compute_dtype == torch.bfloat16
    assert packed.panels.shape == (2, 33, 32, 2) and packed.packed_bytes() == 2 * 33 * 32 * 2 * 2  # 2 bytes a weight
    assert torch.equal(packed.weight, lin.weight.detach())  # unpacked on demand, exactly
    assert packed_linear.layout_bytes(nn.Sequential(packed)) == {"panels": packed.packed_bytes()}
    for rows in (1, 7, 300):
        x = torch.randn(rows, 65).to(torch.bfloat16)
        got = packed(x)
        assert got.dtype == torch.bfloat16
        want = F.linear(x.double(), lin.weight.double(), lin.bias.double())
        torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=2e-2)
        assert torch.equal(got[:1], packed(x[:1]))  # batch-invariant


@panels
def test_a_bf16_model_holds_at_most_2_25_bytes_per_weight(monkeypatch):
    from reference_engine.worker.memory_plan import held_per_weight_byte
    if ops.available():  # by default the pair panels replace the parameter, byte for byte
        assert held_per_weight_byte(576, torch.bfloat16) == 1.0
        assert held_per_weight_byte(576, torch.float32) == 1.0
    monkeypatch.setenv("INFERLAB_LINEAR", "onednn")
    packed_linear.linear_kernel.cache_clear()
    try:  # the parameter and oneDNN's copy (an fp32 one where bf16 is not native)
        assert held_per_weight_byte(576, torch.bfloat16) == (2.0 if packed_linear.native_bf16() else 3.0)
    finally:
        monkeypatch.delenv("INFERLAB_LINEAR")
        packed_linear.linear_kernel.cache_clear()


@panels
def test_a_tied_bf16_embedding_reads_the_lm_heads_pair_panels():
    m = nn.Module()
    m.cfg = type("Cfg", (), {"tie_word_embeddings": True})()
    m.model = nn.Module()
    m.model.embed_tokens = nn.Embedding(70, 15).to(torch.bfloat16)
    m.lm_head = nn.Linear(15, 70, bias=False).to(torch.bfloat16)
    m.lm_head.weight = m.model.embed_tokens.weight
    table = m.model.embed_tokens.weight.detach().clone()
    packed_linear.pack(m)
    assert isinstance(m.model.embed_tokens, PanelEmbedding) and list(m.parameters()) == []
    ids = torch.tensor([[0, 31, 32], [69, 5, 64]])
    assert torch.equal(m.model.embed_tokens(ids), table[ids])


def test_bf16_is_held_once_as_pair_panels_by_default_and_on_onednn_when_pinned():
    """The default kernel holds bf16 once, as pair panels (2 bytes a weight); `kernel="onednn"` (what
    INFERLAB_LINEAR=onednn picks) keeps oneDNN's copy beside the parameter. Both multiply the same bf16
    values with fp32 sums."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    x = torch.randn(300, 64).to(torch.bfloat16)
    want = F.linear(x.float(), lin.weight.float()).to(torch.bfloat16)  # fp32 products of bf16 values
    if ops.available():
        packed = PackedLinear(lin)
        assert packed.panels is not None and packed_linear.layout_bytes(nn.Sequential(packed)) == {
            "panels": 64 * 64 * 2}  # K 64 x 48 columns padded to two 32-column panels, 2 bytes each
        torch.testing.assert_close(packed(x).float(), want.float(), rtol=2e-2, atol=2e-2)
    packed = PackedLinear(lin, kernel="onednn")
    assert packed.panels is None and packed.weight is lin.weight
    got = packed(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert packed_linear.layout_bytes(nn.Sequential(packed)) == {"onednn": packed.packed_bytes()}


def test_the_onednn_pin_keeps_fp32_on_onednn():
    torch.manual_seed(1)
    lin = nn.Linear(96, 80)
    packed = PackedLinear(lin, kernel="onednn")
    assert packed.panels is None and packed.weight is lin.weight
    x = torch.randn(20, 96)
    torch.testing.assert_close(packed(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


def test_linear_kernel_is_chosen_or_pinned(monkeypatch):
    can = ("inferlab", "onednn") if ops.available() else ("onednn",)  # an impossible pin is refused
    assert packed_linear.linear_kernel() == can[0]
    for pin in can:
        monkeypatch.setenv("INFERLAB_LINEAR", pin)
        packed_linear.linear_kernel.cache_clear()
        assert packed_linear.linear_kernel() == pin
    monkeypatch.setenv("INFERLAB_LINEAR", "blas")
    packed_linear.linear_kernel.cache_clear()
    with pytest.raises(ValueError, match="INFERLAB_LINEAR='blas'"):
        packed_linear.linear_kernel()
    monkeypatch.delenv("INFERLAB_LINEAR")
    packed_linear.linear_kernel.cache_clear()
