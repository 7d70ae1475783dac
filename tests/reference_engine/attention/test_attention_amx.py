"""The bf16 prefill on AMX tiles (csrc/attention_amx.cpp), which the CPU backend takes for bf16 prefills where
the bf16 GEMM runs on AMX (`cpu_backend.amx_prefill`): against the PyTorch backend, and its rows' bits
alone, batched and after a cached prefix. Skipped where AMX does not run (any CPU before Xeon's 4th
generation, and every AMD one); `INFERLAB_AMX=0` is checked to turn it off on any CPU."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.reference_engine.attention.test_triton_backend import against_torch, make_case
from tests.reference_engine.attention.test_triton_backend import assert_close

ca = pytest.importorskip("reference_engine.attention.cpu_backend")
from reference_engine.kernels import ops  # noqa: E402

if not ops.available():
    if os.environ.get("CI"):  # `make setup` builds it there: its absence is a failure, not a skip
        pytest.fail("the CPU attention kernel did not build although `make setup` builds it", pytrace=False)
    pytest.skip("the CPU attention kernel does not build here (no C++ compiler with OpenMP)", allow_module_level=True)
on_amx = pytest.mark.skipif(not ops.amx_ready(), reason="AMX does not run here (or INFERLAB_AMX=0)")
BF16 = {torch.bfloat16: 1e-2}


@on_amx
@pytest.mark.parametrize("head_dim, group, block_size", [(64, 3, 16), (128, 1, 16), (96, 2, 5), (64, 4, 128)])
def test_bf16_prefills_on_amx_match_torch(head_dim, group, block_size):
    """From scratch, after cached context, across 256-key softmax chunks (700 keys), ragged 16-row tiles,
    beside decodes; a head size of 96 takes one partial 64-column pass of P V."""
    assert ca.amx_prefill(torch.bfloat16, head_dim)
    seqs = [(9, 1), (0, 70), (37, 50), (650, 50), (255, 3), (0, 2)]
    case = make_case(seqs, group=group, head_dim=head_dim, block_size=block_size, dtype=torch.bfloat16,
                     seed=head_dim + group)
    assert_close(*against_torch(case, ca.CpuBackend), torch.bfloat16, BF16)


def prefill(q, case, lens, starts, tables):
    k, v = case.kv[0]
    out = torch.empty_like(q)
    ops.prefill_amx(q, k, v, tables, lens, starts, q.shape[-1] ** -0.5, out)
    return out


@on_amx
def test_a_rows_bits_do_not_depend_on_its_batch_tile_or_cached_prefix():
    """Three prompts (300, 41, 600 keys; the cache's random rows are their keys) prefilled together, each
    alone, and the last one's final 90 rows after its first 510 keys were cached: the same bits on every row."""
    case = make_case([(0, 300), (0, 41), (0, 600)], group=3, head_dim=64, dtype=torch.bfloat16, seed=5)
    tables, lens = case.meta.block_tables, case.meta.seq_lens
    starts = torch.tensor(case.meta.query_start, dtype=torch.int64)
    q = case.q.contiguous()
    together = prefill(q, case, lens, starts, tables)
    for b in range(3):
        s, e = starts[b].item(), starts[b + 1].item()
        alone = prefill(q[s:e].contiguous(), case, lens[b:b + 1], torch.tensor([0, e - s]), tables[b:b + 1])
        assert torch.equal(alone, together[s:e]), b
    tail = prefill(q[851:941].contiguous(), case, lens[2:3], torch.tensor([0, 90]), tables[2:3])
    assert torch.equal(tail, together[851:941])


def test_amx_off_sends_bf16_prefills_to_the_fp32_sum_kernel():
    code = ("import torch; from reference_engine.attention import cpu_backend as c; "
            "print(c.amx_prefill(torch.bfloat16, 64), c.amx_prefill(torch.float32, 64))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env=os.environ | {"INFERLAB_AMX": "0"})
    assert run.stdout.split() == ["False", "False"], run.stderr[-2000:]
    assert not ca.amx_prefill(torch.float32, 64) and not ca.amx_prefill(torch.bfloat16, 48)
