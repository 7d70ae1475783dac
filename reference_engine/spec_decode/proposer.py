"""The proposer interface: after each step, up to k draft tokens per request for the next one.

A proposer sees each request's context as `req` tokens + the tokens this step produced
(not yet appended: the output processor appends them after stop checks). Drafts are only
guesses; the target verifies them, so a proposer can never change what is generated under
greedy decoding, and under sampling it cannot change the distribution (rejection_sampler.py).

Invariants a proposer keeps:
- it writes KV only into slots the scheduler allocated (`num_lookahead` past the scheduled
  tokens), and only KV of its own model;
- `propose(...)[i]` has at most `num_drafts[i]` tokens; `probs`, when given, holds the
  distribution each token was drawn from (rows of the draft's processed, tempered softmax).
"""
from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass

import torch

from reference_engine.config import EngineConfig, ModelConfig, SpeculativeConfig


@dataclass
class Draft:
    token_ids: list[int]
    probs: torch.Tensor | None = None  # (k, V); None: point masses (n-gram, greedy)


class Proposer(abc.ABC):
    num_lookahead: int = 0  # KV slots past the scheduled tokens that `propose` writes
    kv_bytes_per_token: int = 0  # KV of the proposer's own model, in the target's block ids

    def __init__(self, spec: SpeculativeConfig, cfg: EngineConfig, target: ModelConfig, dtype: torch.dtype,
                 device: torch.device, max_model_len: int):
        self.spec, self.cfg, self.k = spec, cfg, spec.num_speculative_tokens

    def allocate_kv(self, num_blocks: int) -> None:
        """Called once the pool is sized (a draft model's KV uses the same block ids)."""

    def observe(self, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> None:
        """The target's step inputs, after its forward: a draft model computes its KV for them too."""

    @abc.abstractmethod
    def propose(self, reqs: list, block_tables: list[list[int]], new_tokens: list[list[int]], num_drafts: list[int],
                default_gen: torch.Generator) -> list[Draft]:
        """Drafts per request; request i's context is its tokens + new_tokens[i]. `block_tables`: the
        step record's (a draft model writes its KV there); a request's own table is never read."""


PROPOSERS = {"ngram": "reference_engine.spec_decode.ngram:NgramProposer",
             "draft_model": "reference_engine.spec_decode.draft:DraftModelProposer"}


def make_proposer(spec: SpeculativeConfig, cfg: EngineConfig, target: ModelConfig, dtype: torch.dtype,
                  device: torch.device, max_model_len: int) -> Proposer:
    module, name = PROPOSERS[spec.method].split(":")
    return getattr(importlib.import_module(module), name)(spec, cfg, target, dtype, device, max_model_len)
