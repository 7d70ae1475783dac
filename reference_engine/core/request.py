"""Request state: everything the scheduler and runner need to know about one request.

Life cycle: WAITING -> RUNNING -> FINISHED, with RUNNING -> PREEMPTED -> RUNNING when
the cache runs out (preemption by recompute: the blocks are dropped, and on
re-admission prompt + generated tokens are prefilled again).

Invariant: `num_computed_tokens <= len(token_ids)`; the KV of tokens
`[0, num_computed_tokens)` is in the blocks of `block_table`. A request samples in a step
exactly when that step brings `num_computed_tokens` up to `len(token_ids)` (plus any draft
tokens scheduled after them). Only the KV-cache manager changes `block_table`; draft tokens
(`spec_token_ids`) are never part of `token_ids` until the target model accepts them.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from reference_engine.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    status: Status = Status.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # stop | length | abort
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    generator: torch.Generator | None = None  # per-request RNG when params.seed is set
    stop_ids: list[int] = field(default_factory=list)  # EOS + stop_token_ids: banned until min_tokens
    cache_salt: str | None = None  # prefix-cache extra key: only requests with the same salt share blocks
    block_hashes: list[bytes] = field(default_factory=list)  # chain hashes of full blocks, grown lazily
    num_cached_tokens: int = 0  # tokens found in the prefix cache at the latest admission
    spec_token_ids: list[int] = field(default_factory=list)  # draft tokens proposed for the next step
    spec_probs: torch.Tensor | None = None  # (k, V) the draft's distributions (None: greedy or n-gram)
    # timestamps (time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def tokens(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without concatenating the whole history."""
        p = self.prompt_token_ids
        if end <= len(p):
            return p[start:end]
        if start >= len(p):
            return self.output_token_ids[start - len(p):end - len(p)]
        return p[start:] + self.output_token_ids[: end - len(p)]

    @property
    def num_tokens_left(self) -> int:
        """Output tokens the request may still produce (`max_tokens` minus those it has): the one
        definition the scheduler (lookahead), runner (drafts worth proposing) and output processor
        (the length stop) all use."""
        return self.params.max_tokens - len(self.output_token_ids)

    @property
    def num_new_tokens(self) -> int:
        """Tokens whose KV is not yet computed (1 for a decode, the rest of the prompt for a prefill)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.finished_time = time.monotonic()
