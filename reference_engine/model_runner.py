"""The model runner: turns one scheduled step into one forward pass and new tokens per request.

A step is flattened into varlen tensors (`input_batch.py`), decodes first. Logits are
computed only for rows that sample: a request whose step reaches the end of its tokens
samples at its last row, and a request with j draft tokens scheduled after them gets j + 1
rows, verified together (`spec_decode/verifier.py`): it emits its accepted drafts and then
one token from the target, so each request gets a *list* of new tokens.

The runner reads block tables; it never changes them (the scheduler's KV-cache manager
does). With speculation, the proposer runs here too, after verification: a draft model
writes KV into the same block ids (its own tensors), n-gram lookup only reads tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from reference_engine.attention import get_backend
from reference_engine.config import EngineConfig, ModelConfig, parse_dtype
from reference_engine.input_batch import StepBatch, make_batch
from reference_engine.kv_cache import allocate_kv_cache, capacity_blocks
from reference_engine.loader import load_model
from reference_engine.outputs import TokenLogprob
from reference_engine.request import Request
from reference_engine.sampler import logprobs_of, make_batch as sampling_batch, sample
from reference_engine.spec_decode import Draft, make_proposer
from reference_engine.spec_decode.verifier import verify


@dataclass
class RunnerOutput:
    reqs: list[Request] = field(default_factory=list)  # the requests that sampled, in row order
    token_ids: list[list[int]] = field(default_factory=list)  # their new tokens (accepted drafts + 1)
    logprobs: list[list[TokenLogprob] | None] = field(default_factory=list)
    num_accepted: dict[str, int] = field(default_factory=dict)  # per request whose drafts were verified
    drafts: dict[str, Draft] = field(default_factory=dict)  # proposals for the next step


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
        spec = cfg.speculative
        self.proposer = make_proposer(spec, cfg, self.model_config, self.dtype, self.device,
                                      self.max_model_len) if spec else None
        self.num_spec_tokens = spec.num_speculative_tokens if spec else 0
        extra = self.proposer.kv_bytes_per_token if self.proposer else 0
        self.num_blocks = capacity_blocks(cfg, self.model_config, self.dtype, self.max_model_len, extra)
        if self.num_blocks < 1:
            raise ValueError(f"the KV cache must hold at least one block, got {self.num_blocks}")
        self.kv_cache = allocate_kv_cache(self.model_config, self.num_blocks, cfg.block_size, self.dtype,
                                          self.device)
        if self.proposer:
            self.proposer.allocate_kv(self.num_blocks)
        self.backend = get_backend(cfg.attention_backend)(self.kv_cache, cfg.block_size)
        self.default_gen = torch.Generator(device=self.device).manual_seed(cfg.seed)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.cfg.block_size

    @property
    def num_lookahead(self) -> int:
        return self.proposer.num_lookahead if self.proposer else 0

    def prepare(self, scheduled: list[tuple[Request, int]], spec: dict[str, list[int]]
                ) -> tuple[StepBatch, list[int], list[Request], list[list[int]]]:
        """-> batch, logit rows, the requests that sample and their scheduled drafts."""
        order = sorted(scheduled, key=lambda rn: rn[1] != 1)  # stable: decodes first
        seqs, rows, samplers, drafts = [], [], [], []
        offset = 0
        for req, n in order:
            start = req.num_computed_tokens
            d = spec.get(req.request_id, [])
            toks = req.tokens(start, start + n - len(d)) + d
            seqs.append((toks, start, req.block_table))
            offset += n
            if start + n - len(d) == req.num_tokens:  # reaches the end: sample, verifying any drafts
                samplers.append(req)
                drafts.append(d)
                rows.extend(range(offset - 1 - len(d), offset))
        return make_batch(seqs, self.cfg.block_size, self.device), rows, samplers, drafts

    @torch.inference_mode()
    def run(self, scheduled: list[tuple[Request, int]], spec: dict[str, list[int]] | None = None) -> RunnerOutput:
        """One target forward for the whole step (+ the proposer's work with speculation on)."""
        spec = spec or {}
        batch, rows, samplers, drafts = self.prepare(scheduled, spec)
        hidden = self.model(batch.input_ids, batch.positions, self.backend, batch.meta)  # (N, hidden)
        if self.proposer:
            self.proposer.observe(batch.input_ids, batch.positions, batch.meta)
        out = RunnerOutput(reqs=samplers)
        if not samplers:
            return out
        raw = self.model.logits(hidden[torch.tensor(rows, device=self.device)])  # (R, V) float32
        if not spec:  # one row per request: the plain sampling path
            ps = [r.params for r in samplers]
            sb = sampling_batch(ps, [r.prompt_token_ids for r in samplers], [r.output_token_ids for r in samplers],
                                [r.generator for r in samplers], self.device)
            ids = sample(raw, sb, self.default_gen)
            out.token_ids = [[t] for t in ids.tolist()]
            out.logprobs = [None if lp is None else [lp] for lp in logprobs_of(raw, ids, sb.num_logprobs)]
        else:
            out.token_ids = verify(raw, samplers, drafts, self.default_gen)
            out.logprobs = self._logprobs(raw, samplers, drafts, out.token_ids)
            out.num_accepted = {r.request_id: len(t) - 1 for r, d, t in zip(samplers, drafts, out.token_ids) if d}
        if self.proposer:
            limits = [self._max_drafts(r, len(t)) for r, t in zip(samplers, out.token_ids)]
            proposals = self.proposer.propose(samplers, out.token_ids, limits, self.default_gen)
            out.drafts = {r.request_id: p for r, p in zip(samplers, proposals) if p.token_ids}
        return out

    def _max_drafts(self, req: Request, num_new: int) -> int:
        """Drafts worth proposing: the next step emits at most drafts + 1 tokens, within max_tokens."""
        left = req.params.max_tokens - len(req.output_token_ids) - num_new
        return max(0, min(self.num_spec_tokens, left - 1))

    def _logprobs(self, raw, reqs, drafts, tokens) -> list[list[TokenLogprob] | None]:
        out, row = [], 0
        for r, d, t in zip(reqs, drafts, tokens):
            n = r.params.logprobs
            out.append(None if n is None else
                       logprobs_of(raw[row:row + len(t)], torch.tensor(t, device=raw.device), [n] * len(t)))
            row += len(d) + 1
        return out
