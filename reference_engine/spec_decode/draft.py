"""A draft model: a smaller model that shares the target's tokenizer proposes k tokens.

Its KV lives in its own tensors, indexed by the *target's* block ids (vLLM's draft/EAGLE
layout): the manager tracks one set of blocks, and the draft's KV is valid exactly where the
target's is, because the draft runs in lockstep over every token the target computes
(`observe`). So prefix-cache hits, preemption and rollback need nothing extra here:
- a cached block holds both models' KV for its tokens;
- rejected slots hold garbage in both, are never counted as computed, and are rewritten.

`propose` then decodes k tokens autoregressively from each request's newest token, writing
the draft's KV into the lookahead slots the scheduler allocated (`num_lookahead = k`); the
next step's lockstep pass rewrites those slots with whatever the target accepted.
"""
from __future__ import annotations

import torch

from reference_engine.attention import get_backend
from reference_engine.config import ModelConfig
from reference_engine.worker.input_batch import make_batch
from reference_engine.worker.kv_cache import allocate_kv_cache
from reference_engine.model.loader import load_model
from reference_engine.worker.sampler import draw
from reference_engine.worker.sampler import make_batch as sampling_batch
from reference_engine.worker.sampler import process
from reference_engine.spec_decode.proposer import Draft, Proposer


class DraftModelProposer(Proposer):
    def __init__(self, spec, cfg, target, dtype, device, max_model_len):
        super().__init__(spec, cfg, target, dtype, device, max_model_len)
        mc = ModelConfig.from_dir(spec.model)
        if mc.vocab_size != target.vocab_size:
            raise ValueError(f"draft model vocab_size {mc.vocab_size} != target's {target.vocab_size}; "
                             "the draft must share the target's tokenizer")
        if mc.max_position_embeddings < max_model_len:
            raise ValueError(f"draft model max_position_embeddings {mc.max_position_embeddings} < "
                             f"max_model_len {max_model_len}")
        self.model, self.model_config = load_model(spec.model, dtype, device, max_model_len)
        self.dtype, self.device, self.block_size = dtype, device, cfg.block_size
        self.num_lookahead = self.k
        self.kv_bytes_per_token = self.model_config.kv_bytes_per_token(dtype)

    def allocate_kv(self, num_blocks):
        self.kv_cache = allocate_kv_cache(self.model_config, num_blocks, self.block_size, self.dtype, self.device)
        self.backend = get_backend(self.cfg.attention_backend)(self.kv_cache, self.block_size)

    @torch.inference_mode()
    def observe(self, input_ids, positions, meta):
        self.model(input_ids, positions, self.backend, meta)  # only the KV writes matter

    @torch.inference_mode()
    def propose(self, reqs, block_tables, new_tokens, num_drafts, default_gen):
        drafts = [Draft([]) for _ in reqs]
        rows = [i for i, k in enumerate(num_drafts) if k > 0]
        probs: dict[int, list[torch.Tensor]] = {i: [] for i in rows}
        last = {i: new_tokens[i][-1] for i in rows}  # the newest token: its KV is not written yet
        for step in range(max((num_drafts[i] for i in rows), default=0)):
            rows = [i for i in rows if num_drafts[i] > step]
            # (query, position, block table); position of the newest token + step
            seqs = [([last[i]], reqs[i].num_tokens + len(new_tokens[i]) - 1 + step, block_tables[i])
                    for i in rows]
            b = make_batch(seqs, self.block_size, self.device)
            logits = self.model.logits(self.model(b.input_ids, b.positions, self.backend, b.meta))  # (R, V)
            sb = sampling_batch([reqs[i].params for i in rows], [reqs[i].prompt_token_ids for i in rows],
                                [reqs[i].output_token_ids + new_tokens[i] + drafts[i].token_ids for i in rows],
                                [reqs[i].generator for i in rows], self.device,
                                [reqs[i].stop_ids for i in rows])
            x, greedy = process(logits, sb)
            if sb.all_greedy:
                toks = greedy.tolist()
            else:
                p = x.softmax(-1)
                toks = torch.where(sb.random, draw(p, sb.generators, default_gen), greedy).tolist()
            for r, i in enumerate(rows):
                drafts[i].token_ids.append(toks[r])
                last[i] = toks[r]
                if not reqs[i].params.greedy:
                    probs[i].append(p[r])
        for i, ps in probs.items():
            if ps:
                drafts[i].probs = torch.stack(ps)  # (k, V)
        return drafts
