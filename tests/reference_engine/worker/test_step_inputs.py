"""Persistent step buffers (input_batch.StepInputs) against the fresh-tensor builder (make_batch):
same values, reused across steps without leaking the previous step, padded for CUDA graphs."""
from __future__ import annotations

import random

import pytest
import torch

from reference_engine import LLM, EngineConfig, SamplingParams
from reference_engine.worker.input_batch import PAD_SLOT, StepInputs, make_batch
from reference_engine.worker.model_runner import ModelRunner

BS = 4


def steps(seed: int = 0) -> list[list[tuple[list[int], int, list[int]]]]:
    """Random steps (decodes first, then prefill chunks on cached context), block ids shuffled."""
    rng = random.Random(seed)
    out = []
    for num_dec, num_pre in [(1, 0), (5, 0), (0, 3), (4, 2), (7, 1), (2, 0)]:
        ids = list(range(200))
        rng.shuffle(ids)
        seqs = []
        for i in range(num_dec + num_pre):
            start = rng.randint(0, 40)
            q = 1 if i < num_dec else rng.randint(2, 12)
            nb = -(-(start + q) // BS)
            table, ids = ids[:nb], ids[nb:]
            seqs.append(([rng.randint(0, 999) for _ in range(q)], start, table))
        out.append(seqs)
    return out


def test_fill_equals_make_batch_and_reuse_does_not_leak():
    buf = StepInputs(max_tokens=64, max_seqs=8, max_blocks=16, block_size=BS, device="cpu")
    for seqs in steps() + steps(1)[::-1]:  # big and small steps in both orders over the same buffers
        ref, got = make_batch(seqs, BS, "cpu"), buf.fill(seqs)
        assert torch.equal(got.input_ids, ref.input_ids) and torch.equal(got.positions, ref.positions)
        m, r = got.meta, ref.meta
        assert torch.equal(m.slot_mapping, r.slot_mapping)
        assert torch.equal(m.seq_lens, r.seq_lens)
        assert (m.query_lens, m.seq_lens_list, m.query_start) == (r.query_lens, r.seq_lens_list, r.query_start)
        assert (m.num_decodes, m.max_decode_len) == (r.num_decodes, r.max_decode_len)
        width = r.block_tables.shape[1]
        for i, (_, _, table) in enumerate(seqs):  # each table's own entries; the rest are never read
            assert m.block_tables[i, :len(table)].tolist() == table
            assert m.block_tables.shape[1] >= width
        assert m.cu_seqlens_q.tolist() == r.query_start and m.cu_seqlens_q.dtype == torch.int32
        assert m.max_query_len == max(r.query_lens) and m.max_seq_len == max(r.seq_lens_list)
        assert got.logit_rows is None


def test_logit_rows_only_when_not_every_row():
    buf = StepInputs(64, 8, 16, BS, "cpu")
    seqs = [([5], 3, [0]), ([6, 7, 8], 0, [1])]
    assert buf.fill(seqs, rows=[0, 3]).logit_rows.tolist() == [0, 3]
    assert buf.fill(seqs[:1], rows=[0]).logit_rows is None  # every row samples: no gather needed


def test_padding_to_a_bucket():
    buf = StepInputs(64, 8, 16, BS, "cpu")
    buf.fill([([1, 2, 3], 0, [3]), ([4], 9, [5, 6, 7])])  # leaves non-padding values behind
    seqs = [([11], 6, [2, 9]), ([12], 2, [4])]
    got = buf.fill(seqs, pad_to=5)
    ref = make_batch(seqs, BS, "cpu")
    assert torch.equal(got.input_ids[:2], ref.input_ids) and got.input_ids[2:].tolist() == [0, 0, 0]
    assert got.positions[2:].tolist() == [0, 0, 0]
    assert torch.equal(got.meta.slot_mapping[:2], ref.meta.slot_mapping)
    assert got.meta.slot_mapping[2:].tolist() == [PAD_SLOT] * 3
    assert got.meta.seq_lens.tolist() == [7, 3, 0, 0, 0]
    assert got.meta.cu_seqlens_q.tolist() == [0, 1, 2, 2, 2, 2]  # padded sequences: zero query tokens
    assert got.meta.query_start == [0, 1, 2] and got.meta.seq_lens_list == [7, 3]  # the real step's lists
    empty = buf.fill([], pad_to=3)  # what graphs are captured over: padding only
    assert empty.meta.slot_mapping.tolist() == [PAD_SLOT] * 3 and empty.meta.cu_seqlens_q.tolist() == [0] * 4
    with pytest.raises(ValueError, match="one-token"):
        buf.fill([([1, 2], 0, [0])], pad_to=4)
    with pytest.raises(ValueError, match="exceeds"):
        buf.fill(seqs, pad_to=9)


def test_limits_are_one_line_errors():
    buf = StepInputs(max_tokens=4, max_seqs=2, max_blocks=2, block_size=BS, device="cpu")
    with pytest.raises(ValueError, match="exceeds the buffers"):
        buf.fill([([1] * 5, 0, [0, 1])])
    with pytest.raises(ValueError, match="block table of 3 blocks"):
        buf.fill([([1], 9, [0, 1, 2])])


def test_runner_buffers_sized_for_any_step(tiny_llama):
    r = ModelRunner(EngineConfig(str(tiny_llama), max_model_len=100, max_num_seqs=6, max_num_batched_tokens=48))
    assert (r.inputs.max_tokens, r.inputs.max_seqs) == (48, 6)
    assert r.inputs.max_blocks * r.cfg.block_size >= 100
    assert r.graphs is None and not r.use_graphs  # CPU: eager, whatever enforce_eager says


def test_engine_output_unchanged_by_buffer_reuse(tiny_llama):
    """The runner fills the same buffers every step: a batch whose requests come and go (different
    lengths, chunked prefill, finishing at different steps) gives each request the tokens it gets
    alone (greedy), i.e. nothing from an earlier step leaks into a later one."""
    prompts = [[11 + i for i in range(n)] for n in (3, 17, 5, 30)]
    lens = [4, 9, 2, 6]
    llm = LLM(str(tiny_llama), max_num_batched_tokens=16, block_size=8)
    batched = [o.token_ids for o in llm.generate(prompts, [SamplingParams(max_tokens=m, temperature=0.0,
                                                                          ignore_eos=True) for m in lens])]
    alone = [llm.generate([p], SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))[0].token_ids
             for p, m in zip(prompts, lens)]
    assert batched == alone
