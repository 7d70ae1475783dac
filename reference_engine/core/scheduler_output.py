"""What the scheduler hands on each step: the runner's plain record and the engine's bookkeeping.

Kept apart from `scheduler.py` so that the runner can read a step without importing the scheduler,
its KV-cache manager or the block pool (`tests/test_architecture.py` enforces it), as vLLM v1's
runner reads `SchedulerOutput` (`v1/core/sched/output.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from reference_engine.core.request import Request


@dataclass
class ScheduledSeq:
    """One sequence of a step, as the runner needs it. `block_table` is the request's own list:
    valid until `update_from_output` (nothing changes it between `schedule` and the forward).
    `req` is the sampling row's source (params, generator, history), read only."""
    req: Request
    token_ids: list[int]  # query tokens: the request's uncomputed tokens, then its drafts
    start: int  # position of the first query token
    block_table: list[int]
    samples: bool  # the step reaches the end of the request's tokens: it samples (verifying drafts)
    drafts: list[int]

    @property
    def kind(self) -> str:
        """The one definition of a row's kind, read by the engine, the runner and the step log:
        "decode": one query token, a generated one fed back;
        "verify": drafts scheduled after the request's tokens (several rows, verified together);
        "prefill": prompt tokens, or output recomputed after a preemption. A prompt's one-token last
        chunk is a prefill: every prompt row takes the prefill kernel however the prompt was chunked or
        prefix-cached, so its bits do not move (vLLM counts any one-token query as a decode)."""
        if self.drafts:
            return "verify"
        return "decode" if len(self.token_ids) == 1 and self.start >= self.req.num_prompt_tokens else "prefill"


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens this step)
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)  # drafts scheduled after a request's tokens
    preempted: list[Request] = field(default_factory=list)
    prefix_hits: dict[str, int] = field(default_factory=dict)  # admitted this step: tokens found cached
    seqs: list[ScheduledSeq] = field(default_factory=list)  # the runner's record, in `scheduled` order
    prefix_cache_queries: int = 0  # tokens looked up by this step's admissions
    prefix_cache_hits: int = 0  # of which found cached

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
