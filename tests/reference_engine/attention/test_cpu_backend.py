"""The CPU attention backend ("cpu": C++ decode and prefill kernels) against the PyTorch backend.

Same cases as the Triton tests (`make_case`: random cache blocks in a random permutation, so a
wrong block or a slot past a sequence's end changes the result), on the backend the engine picks
by default on CPU. Skipped only where the kernel cannot be built (no C++ compiler).
"""
from __future__ import annotations

import os

import pytest
import torch

from reference_engine import attention
from reference_engine.config import EngineConfig
from tests.reference_engine.attention.test_triton_backend import MIXED, against_torch, make_case
from tests.reference_engine.attention.test_triton_backend import assert_close as triton_close

ca = pytest.importorskip("reference_engine.attention.cpu_backend")
from reference_engine.kernels import ops  # noqa: E402

if not ops.available():
    if os.environ.get("CI"):  # `make setup` builds it there: its absence is a failure, not a skip
        pytest.fail("the CPU attention kernel did not build although `make setup` builds it", pytrace=False)
    pytest.skip("the CPU attention kernel does not build here (no C++ compiler with OpenMP)", allow_module_level=True)

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def run_both(case):
    return against_torch(case, ca.CpuBackend)


def assert_close(out, ref, dtype):
    triton_close(out, ref, dtype, TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_mixed_batch_matches_torch(group, dtype):
    """Decodes (contexts ending on and around block boundaries) batched with prefill chunks."""
    case = make_case(MIXED, group=group, dtype=dtype, seed=group)
    assert_close(*run_both(case), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [12, 64])
def test_long_prefill_chunks(head_dim, dtype):
    """Chunks of several 16-row tiles (a ragged last tile), from scratch and after cached context,
    with 3 query heads per kv head; the vector (64) and scalar (12) paths."""
    case = make_case([(5, 1), (0, 70), (37, 50), (16, 33)], group=3, head_dim=head_dim, dtype=dtype, seed=head_dim)
    assert_close(*run_both(case), dtype)


@pytest.mark.parametrize("head_dim", [8, 12, 32, 64, 128])
def test_head_dims(head_dim):
    """Vector path (head_dim % 8 == 0) and scalar path (12) alike."""
    case = make_case([(1, 1), (7, 1), (8, 1), (9, 1), (40, 1), (17, 1)], head_dim=head_dim, group=2, seed=head_dim)
    assert_close(*run_both(case), torch.float32)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("batch", [1, 2, 7])
def test_few_sequences_split_heads(batch, threads):
    """Fewer sequences than threads: a sequence's kv heads are split over tasks."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        seqs = [(13 * i + 5, 1) for i in range(batch)]
        case = make_case(seqs, kv_heads=4, group=2, seed=batch)
        assert_close(*run_both(case), torch.float32)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("block_size", [1, 5, 32])
def test_block_sizes(block_size):
    b = block_size
    case = make_case([(b - 1 or 1, 1), (b, 1), (2 * b + 3, 1), (b + 1, 4)], block_size=b, group=2, seed=b)
    assert_close(*run_both(case), torch.float32)


def test_strided_tables_and_int32_lengths():
    """The runner's step buffers: a table view narrower than its buffer row, int32 lengths (Triton's)."""
    case = make_case([(20, 1), (3, 1), (35, 1)], group=2, seed=3)
    wide = torch.zeros(8, 10, dtype=torch.int64)
    wide[:3, :case.meta.block_tables.shape[1]] = case.meta.block_tables
    case.meta.block_tables = wide[:3]
    case.meta.seq_lens = case.meta.seq_lens.to(torch.int32)
    assert_close(*run_both(case), torch.float32)


def test_float16_falls_back_to_torch():
    case = make_case([(20, 1), (3, 1)], group=2, dtype=torch.float16, seed=4)
    out, ref = run_both(case)
    assert torch.equal(out, ref)


def test_registered_and_default_on_cpu():
    assert attention.get_backend("cpu") is ca.CpuBackend
    from reference_engine.worker.backends import with_default_backends

    assert EngineConfig("m").attention_backend is None  # config is data: the runner resolves the default
    assert with_default_backends(EngineConfig("m")).attention_backend == "cpu"


def test_kv_write_takes_rows_strided_as_the_qkv_views_and_refuses_a_slot_past_the_cache():
    k_cache, v_cache = torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8)  # 12 slots of 2 heads x 8
    qkv = torch.randn(5, (4 + 2 + 2) * 8)
    k, v = qkv[:, 32:48].view(5, 2, 8), qkv[:, 48:].view(5, 2, 8)  # row stride 64, as the projection's views
    slots = torch.tensor([11, 0, 5, 6, 3])
    ops.kv_write(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache.view(-1, 2, 8)[slots], k) and torch.equal(v_cache.view(-1, 2, 8)[slots], v)
    others = [s for s in range(12) if s not in slots.tolist()]
    assert not k_cache.view(-1, 2, 8)[others].any() and not v_cache.view(-1, 2, 8)[others].any()
    with pytest.raises(RuntimeError, match="out of range"):
        ops.kv_write(k[:1], v[:1], k_cache, v_cache, torch.tensor([12]))
