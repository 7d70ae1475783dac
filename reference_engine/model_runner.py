"""The model runner: turns one scheduled step into one forward pass and sampled tokens.

A step is flattened (nano-vllm style) into varlen tensors:
  input_ids (N,), positions (N,), slot_mapping (N,)   -- N = all scheduled tokens
  block_tables (B, max_blocks), seq_lens (B,)          -- B = scheduled sequences
Decodes (one query token) go first so the attention backend can batch them.
Logits are computed only for sequences that sample this step (a finished prompt or a
decode), not for every prompt token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference_engine.attention import AttentionMetadata, get_backend
from reference_engine.config import EngineConfig, ModelConfig, parse_dtype
from reference_engine.kv_cache import BlockPool, allocate_kv_cache, capacity_blocks
from reference_engine.loader import load_model
from reference_engine.outputs import TokenLogprob
from reference_engine.request import Request
from reference_engine.sampler import SamplingBatch, logprobs_of, sample


@dataclass
class StepBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # (S,) row of each sampling sequence in the flat batch
    samplers: list[Request]  # the S requests that sample this step, in row order


class ModelRunner:
    def __init__(self, cfg: EngineConfig, max_model_len: int | None = None):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.dtype = parse_dtype(cfg.dtype)
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        mcfg = ModelConfig.from_dir(cfg.model)
        # Within a sliding window, sliding attention equals full attention: cap the context there.
        limit = min(mcfg.max_position_embeddings, mcfg.sliding_window or mcfg.max_position_embeddings)
        self.max_model_len = min(cfg.max_model_len or limit, limit)
        self.model, self.model_config = load_model(cfg.model, self.dtype, self.device, self.max_model_len)
        num_blocks = capacity_blocks(cfg, self.model_config, self.dtype, self.max_model_len)
        self.pool = BlockPool(num_blocks, cfg.block_size)
        self.kv_cache = allocate_kv_cache(self.model_config, num_blocks, cfg.block_size, self.dtype, self.device)
        self.backend = get_backend(cfg.attention_backend)(self.kv_cache, cfg.block_size)
        self.default_gen = torch.Generator(device=self.device).manual_seed(cfg.seed)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.pool.block_size

    def prepare(self, scheduled: list[tuple[Request, int]]) -> StepBatch:
        order = sorted(scheduled, key=lambda rn: rn[1] != 1)  # stable: decodes first
        tokens: list[int] = []
        starts, qlens, tables, samplers, sample_rows = [], [], [], [], []
        offset = 0
        for req, n in order:
            start = req.num_computed_tokens
            tokens += _token_slice(req, start, start + n)
            starts.append(start)
            qlens.append(n)
            tables.append(req.block_table)
            offset += n
            if start + n == req.num_tokens:  # this step reaches the end: sample a token
                samplers.append(req)
                sample_rows.append(offset - 1)
        dev = self.device
        q_lens = torch.tensor(qlens, dtype=torch.int64)
        seq_start = torch.tensor(starts, dtype=torch.int64)
        cu = torch.zeros(len(qlens) + 1, dtype=torch.int64)
        torch.cumsum(q_lens, 0, out=cu[1:])
        n_tok = int(cu[-1])
        # positions: per token, its sequence's start + its index within the chunk
        positions = torch.arange(n_tok) - torch.repeat_interleave(cu[:-1] - seq_start, q_lens)
        seq_idx = torch.repeat_interleave(torch.arange(len(qlens)), q_lens)
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int64)
        bs = self.cfg.block_size
        slots = block_tables[seq_idx, positions // bs] * bs + positions % bs
        seq_lens = seq_start + q_lens
        num_decodes = sum(1 for q in qlens if q == 1)
        meta = AttentionMetadata(
            slot_mapping=slots.to(dev), block_tables=block_tables.to(dev), seq_lens=seq_lens.to(dev),
            query_lens=qlens, seq_lens_list=seq_lens.tolist(), query_start=cu.tolist(),
            num_decodes=num_decodes, max_decode_len=int(seq_lens[:num_decodes].max()) if num_decodes else 0,
        )
        return StepBatch(torch.tensor(tokens, dtype=torch.int64, device=dev), positions.to(dev), meta,
                         torch.tensor(sample_rows, dtype=torch.int64, device=dev), samplers)

    def sampling_batch(self, reqs: list[Request]) -> SamplingBatch:
        ps = [r.params for r in reqs]
        dev = self.device

        def col(name, dtype=torch.float32):
            return torch.tensor([getattr(p, name) for p in ps], dtype=dtype, device=dev)

        needs_more = any(not p.greedy or p.repetition_penalty != 1.0 or p.presence_penalty != 0.0
                         or p.frequency_penalty != 0.0 for p in ps)
        return SamplingBatch(
            temperature=col("temperature"), top_k=col("top_k", torch.int64), top_p=col("top_p"),
            min_p=col("min_p"), repetition_penalty=col("repetition_penalty"),
            presence_penalty=col("presence_penalty"), frequency_penalty=col("frequency_penalty"),
            prompt_ids=[r.prompt_token_ids for r in reqs], output_ids=[r.output_token_ids for r in reqs],
            generators=[r.generator for r in reqs], num_logprobs=[p.logprobs for p in ps],
            all_greedy=not needs_more,
        )

    @torch.inference_mode()
    def run(self, scheduled: list[tuple[Request, int]]) -> tuple[list[Request], list[int], list[TokenLogprob | None]]:
        """One forward for the whole step. Returns the sampling requests, their new tokens, logprobs."""
        batch = self.prepare(scheduled)
        hidden = self.model(batch.input_ids, batch.positions, self.backend, batch.meta)  # (N, hidden)
        if not batch.samplers:
            return [], [], []
        raw = self.model.logits(hidden[batch.sample_rows])  # (S, V) float32
        sb = self.sampling_batch(batch.samplers)
        ids = sample(raw, sb, self.default_gen)
        return batch.samplers, ids.tolist(), logprobs_of(raw, ids, sb.num_logprobs)


def _token_slice(req: Request, start: int, end: int) -> list[int]:
    """Tokens [start, end) of prompt + output, without concatenating the whole history."""
    p = req.prompt_token_ids
    if end <= len(p):
        return p[start:end]
    if start >= len(p):
        return req.output_token_ids[start - len(p):end - len(p)]
    return p[start:] + req.output_token_ids[: end - len(p)]
