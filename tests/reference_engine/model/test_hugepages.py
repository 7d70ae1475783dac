"""The huge-page arena: what it hands out, that the kernel was asked for 2 MiB pages (the mapping's VmFlags),
and that the engine's panels and KV cache live in such arenas. Whether the kernel then grants 2 MiB pages
depends on its free memory, so that is reported (`effective_config()["huge_pages"]`), not asserted."""
import mmap
import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from reference_engine.kernels import cpp_gemm
from reference_engine.model import hugepages, packed_linear
from reference_engine.worker.kv_cache import allocate_kv_cache

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and MADV_HUGEPAGE are Linux's")


def test_takes_are_aligned_disjoint_zero_and_bounded():
    a = hugepages.Arena(3 * (1 << 20))
    assert a.region.data_ptr() % hugepages.HUGE == 0 and a.nbytes == hugepages.HUGE * 2
    got = [a.take((5, 7), torch.float32), a.take((3, 11, 2), torch.bfloat16), a.take((1000,), torch.float32)]
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in got)
    assert all(lo % hugepages.ALIGN == 0 for lo, _ in spans)
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))  # no overlap
    assert spans[0][0] >= a.region.data_ptr() and spans[-1][1] <= a.region.data_ptr() + a.nbytes
    assert all(t.is_contiguous() and not t.any() for t in got)
    got[0].fill_(3.0)
    assert not got[2].any()  # writing one leaves the others alone
    with pytest.raises(ValueError, match="left"):
        a.take((a.nbytes,), torch.float32)


@linux
def test_arena_is_advised_for_huge_pages():
    t = hugepages.Arena(4 << 20).take((1 << 20,), torch.float32)
    r = hugepages.residency([t])
    assert r["advised"] >= 4 << 20 and r["mapped"] >= r["advised"]
    # a mapping nobody advised reads 0 (not torch.empty: NumPy advises its large arrays, and with the
    # engine's raised mmap threshold those live in the heap that torch's tensors reuse)
    m = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    plain = torch.frombuffer(m, dtype=torch.uint8)
    assert hugepages.residency([plain])["mapped"] >= 4 << 20 and hugepages.residency([plain])["advised"] == 0


@linux
def test_panels_of_a_model_share_one_advised_arena_and_keep_their_bits(monkeypatch):
    monkeypatch.delenv("INFERLAB_LINEAR", raising=False)
    packed_linear.linear_kernel.cache_clear()
    if packed_linear.linear_kernel() != "inferlab":
        pytest.skip("no C++ kernel here")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 40, bias=False))
    x = torch.randn(5, 64)
    want = [cpp_gemm.pack(model[0].weight), cpp_gemm.pack(model[2].weight)]
    packed_linear.pack(model)
    panels = [model[0].panels, model[2].panels]
    assert all(torch.equal(p, w) for p, w in zip(panels, want))  # the same panels, written in place
    lo = min(p.data_ptr() for p in panels)
    assert lo % hugepages.HUGE == 0  # the first panel opens the arena
    assert hugepages.residency(panels)["advised"] >= hugepages.HUGE
    assert model(x).shape == (5, 40)


@linux
def test_cpu_kv_cache_is_zeroed_in_an_advised_arena():
    mc = SimpleNamespace(num_layers=3, num_kv_heads=2, head_dim=8)  # what the allocation reads
    cache = allocate_kv_cache(mc, 10, 16, torch.float32, "cpu")
    flat = [t for pair in cache for t in pair]
    assert len(flat) == 6 and all(t.shape == (10, 16, 2, 8) and not t.any() for t in flat)
    assert len({t.data_ptr() for t in flat}) == 6
    assert hugepages.residency(flat)["advised"] >= hugepages.HUGE


@linux
def test_inferlab_hugepages_0_leaves_the_arena_on_small_pages(monkeypatch):
    monkeypatch.setenv("INFERLAB_HUGEPAGES", "0")
    t = hugepages.Arena(4 << 20).take((1 << 20,), torch.float32)
    r = hugepages.residency([t])
    assert r["mapped"] >= 4 << 20 and r["advised"] == 0 and r["huge"] == 0
