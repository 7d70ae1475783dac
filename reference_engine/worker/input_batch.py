"""Step inputs: sequences flattened into varlen tensors (nano-vllm style), for any model.

    input_ids (N,), positions (N,), slot_mapping (N,)    N = all query tokens of the step
    block_tables (B, max_blocks), seq_lens (B,)          B = sequences
    cu_seqlens_q (B+1,)                                  query offsets into the N tokens

Two builders of the same values:
- `make_batch`: fresh tensors each call (the draft model's steps);
- `StepInputs`: buffers allocated once, filled in place each step (the target's runner). The host
  side is numpy views of CPU tensors (pinned on CUDA); on CUDA every field has a device tensor of
  its own, allocated once, that each step copies its rows into (non-blocking), so a step allocates
  nothing on the device and a CUDA graph captured over those tensors reads every later step's
  values. On CPU host and device tensors are the same memory: no copy at all.

Sequences with one query token (decodes) must come first: the attention backend batches them.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from reference_engine.attention import AttentionMetadata

PAD_SLOT = -1  # slot of a padding token: the KV store skips negative slots


@dataclass
class StepBatch:
    input_ids: torch.Tensor  # (N,)
    positions: torch.Tensor  # (N,)
    meta: AttentionMetadata
    logit_rows: torch.Tensor | None = None  # (R,) rows of the hidden states that sample; None: all N


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


class Buffer:
    """One field: `host` (a CPU tensor, pinned on CUDA), `np` (its numpy view) and `dev` (the device
    tensor, or `host` itself on CPU). Allocated once; `push(n)` copies the first n rows over."""

    def __init__(self, shape: int | tuple[int, ...], dtype: torch.dtype, device: torch.device):
        on_cpu = device.type == "cpu"
        self.host = torch.zeros(shape, dtype=dtype, pin_memory=device.type == "cuda")
        self.np = self.host.numpy()
        self.dev = self.host if on_cpu else torch.zeros(shape, dtype=dtype, device=device)

    def push(self, n: int) -> torch.Tensor:
        """-> the device view of rows [:n], holding the host's values once the copy has run. The copy
        is non-blocking: the host rows must not change until it has run (`StepInputs.fill` waits for
        the previous step's copies before writing)."""
        if self.dev is not self.host:
            self.dev[:n].copy_(self.host[:n], non_blocking=True)
        return self.dev[:n]


class StepInputs:
    """Persistent step buffers for up to `max_tokens` tokens and `max_seqs` sequences, each with at
    most `max_blocks` blocks. `fill` writes a step and returns a `StepBatch` of views into them.

    Padding (CUDA graphs): `fill(..., pad_to=b)` for a step of n one-token sequences (n <= b) also
    writes rows n..b-1 as padding: token id 0 at position 0 with slot -1, a sequence of zero query
    tokens and zero context (cu_seqlens_q stays at n). Their block-table rows are left as they are:
    a sequence of length 0 reads no block.

    Cost per step: host work O(tokens + sequences x their blocks); the device copy moves whole
    block-table rows, O(B x max_blocks) (as vLLM's), so a very long max_model_len costs a little
    more per step."""

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks: int, block_size: int,
                 device: str | torch.device, table_dtype: torch.dtype = torch.int64):
        """table_dtype: of block_tables and seq_lens. int32 for the Triton kernels (half the bytes);
        int64 for the torch backend, whose indexing would convert int32 on every layer."""
        self.device = torch.device(device)
        self.block_size, self.max_tokens, self.max_seqs, self.max_blocks = block_size, max_tokens, max_seqs, max_blocks
        self.input_ids = Buffer(max_tokens, torch.int64, self.device)
        self.positions = Buffer(max_tokens, torch.int64, self.device)
        self.slot_mapping = Buffer(max_tokens, torch.int64, self.device)
        self.logit_rows = Buffer(max_tokens, torch.int64, self.device)
        self.seq_lens = Buffer(max_seqs, table_dtype, self.device)
        self.cu_seqlens_q = Buffer(max_seqs + 1, torch.int32, self.device)
        self.block_tables = Buffer((max_seqs, max_blocks), table_dtype, self.device)
        # recorded after each step's host-to-device copies (CUDA only: on CPU nothing is copied)
        self.copied = torch.cuda.Event() if self.device.type == "cuda" else None

    def fill(self, seqs: list[tuple[list[int], int, list[int]]], rows: list[int] | None = None,
             pad_to: int | None = None, decodes: int | None = None) -> StepBatch:
        """seqs as for `make_batch`; rows: the token rows that sample (None: all of them);
        pad_to: pad a step of one-token sequences to that many (see the class docstring); decodes: how
        many of the leading one-token sequences decode (None: all of them; the runner says, since a
        prompt's one-token chunk is a prefill)."""
        if self.copied is not None:  # the last step's copies must have read the host rows we rewrite
            self.copied.synchronize()  # (done already whenever that step read its tokens back)
        b = len(seqs)
        q_lens = [len(t) for t, _, _ in seqs]
        starts = np.fromiter((s for _, s, _ in seqs), dtype=np.int64, count=b)
        n = sum(q_lens)
        if n > self.max_tokens or b > self.max_seqs:
            raise ValueError(f"step of {n} tokens / {b} sequences exceeds the buffers' {self.max_tokens} / "
                             f"{self.max_seqs}")
        bt = self.block_tables.np
        for i, (_, _, table) in enumerate(seqs):
            if len(table) > self.max_blocks:
                raise ValueError(f"a block table of {len(table)} blocks exceeds the buffers' {self.max_blocks}")
            bt[i, :len(table)] = table
        ids, pos, slots = self.input_ids.np, self.positions.np, self.slot_mapping.np
        cu, lens = self.cu_seqlens_q.np, self.seq_lens.np
        ids[:n] = list(chain.from_iterable(t for t, _, _ in seqs))
        cu[0] = 0
        if n == b:  # every sequence has one query token: the common decode step, no repeats needed
            cu[1:b + 1] = np.arange(1, b + 1)
            pos[:n] = starts
            seq_idx = np.arange(b)
        else:
            np_q = np.array(q_lens, dtype=np.int64)
            np.cumsum(np_q, out=cu[1:b + 1])
            seq_idx = np.repeat(np.arange(b), np_q)
            pos[:n] = np.arange(n) - np.repeat(cu[:b] - starts, np_q)  # start + index within the chunk
        p = pos[:n]
        slots[:n] = bt[seq_idx, p // self.block_size].astype(np.int64) * self.block_size + p % self.block_size
        lens[:b] = starts + q_lens
        seq_lens_list = lens[:b].tolist()
        num_decodes = 0
        while num_decodes < b and q_lens[num_decodes] == 1:
            num_decodes += 1
        if decodes is not None:
            if decodes > num_decodes:
                raise ValueError(f"{decodes} decodes, but only the first {num_decodes} sequences have one query token")
            num_decodes = decodes
        max_decode_len = max(seq_lens_list[:num_decodes], default=0)
        nt, ns = n, b  # rows pushed: tokens, sequences
        if pad_to is not None and pad_to > b:
            if n != b:
                raise ValueError("only steps of one-token sequences are padded")
            if pad_to > min(self.max_tokens, self.max_seqs):
                raise ValueError(f"pad_to {pad_to} exceeds the buffers")
            ids[n:pad_to], pos[n:pad_to], slots[n:pad_to] = 0, 0, PAD_SLOT
            lens[b:pad_to] = 0
            cu[b + 1:pad_to + 1] = n
            nt = ns = pad_to
        logit_rows = None
        if rows is not None and (len(rows) != n or rows[-1] != n - 1):  # not simply every row
            self.logit_rows.np[:len(rows)] = rows
            logit_rows = self.logit_rows.push(len(rows))
        self.block_tables.push(b)  # padding rows are never read: their sequences have no context
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping.push(nt), block_tables=self.block_tables.dev[:ns],
            seq_lens=self.seq_lens.push(ns), query_lens=q_lens, seq_lens_list=seq_lens_list,
            query_start=cu[:b + 1].tolist(), num_decodes=num_decodes, max_decode_len=max_decode_len,
            cu_seqlens_q=self.cu_seqlens_q.push(ns + 1), max_query_len=max(q_lens, default=0),
            max_seq_len=max(seq_lens_list, default=0))
        batch = StepBatch(self.input_ids.push(nt), self.positions.push(nt), meta, logit_rows)
        if self.copied is not None:
            self.copied.record()
        return batch
