"""Step inputs: sequences flattened into varlen tensors (nano-vllm style), for any model.

    input_ids (N,), positions (N,), slot_mapping (N,)    N = all query tokens of the step
    block_tables (B, max_blocks), seq_lens (B,)          B = sequences

The target's runner and the draft model both build their steps here. Sequences with one
query token (decodes) must come first: the attention backend batches them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.attention import AttentionMetadata


@dataclass
class StepBatch:
    input_ids: torch.Tensor  # (N,)
    positions: torch.Tensor  # (N,)
    meta: AttentionMetadata


def make_batch(seqs: list[tuple[list[int], int, list[int]]], block_size: int, device) -> StepBatch:
    """seqs: (query tokens, position of the first one, block table) per sequence, decodes first."""
    tokens: list[int] = []
    for toks, _, _ in seqs:
        tokens += toks
    q_lens = torch.tensor([len(t) for t, _, _ in seqs], dtype=torch.int64)
    seq_start = torch.tensor([s for _, s, _ in seqs], dtype=torch.int64)
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int64)
    torch.cumsum(q_lens, 0, out=cu[1:])
    # positions: per token, its sequence's start + its index within the chunk
    positions = torch.arange(int(cu[-1])) - torch.repeat_interleave(cu[:-1] - seq_start, q_lens)
    seq_idx = torch.repeat_interleave(torch.arange(len(seqs)), q_lens)
    width = max(len(t) for _, _, t in seqs)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for _, _, t in seqs], dtype=torch.int64)
    slots = block_tables[seq_idx, positions // block_size] * block_size + positions % block_size
    seq_lens = seq_start + q_lens
    qlens = q_lens.tolist()
    num_decodes = 0
    while num_decodes < len(qlens) and qlens[num_decodes] == 1:
        num_decodes += 1
    meta = AttentionMetadata(
        slot_mapping=slots.to(device), block_tables=block_tables.to(device), seq_lens=seq_lens.to(device),
        query_lens=qlens, seq_lens_list=seq_lens.tolist(), query_start=cu.tolist(),
        num_decodes=num_decodes, max_decode_len=int(seq_lens[:num_decodes].max()) if num_decodes else 0,
    )
    return StepBatch(torch.tensor(tokens, dtype=torch.int64, device=device), positions.to(device), meta)
