"""What the engine hands back: per-step deltas (streaming) and whole completions."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)  # top-n alternatives, id -> logprob


@dataclass
class TokenDelta:
    """The news about one request from one engine step (new tokens only)."""

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that matched
    logprobs: list[TokenLogprob] | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0


@dataclass
class CompletionOutput:
    """A finished request, as `LLM.generate` returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprob] | None = None
    num_preemptions: int = 0
