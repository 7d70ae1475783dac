"""Per-request sampling settings, validated once, when they are made (`__post_init__`).

Construction is the boundary: the server, the adapters and `LLM.generate` all build a
`SamplingParams`, and nothing downstream validates its fields again (the engine checks only what
depends on the request and the model: prompt ids, lengths against the context and the KV cache).
Treat an instance as read-only once made. "Greedy" is defined here, once: `greedy` (temperature
below vLLM's epsilon) and `argmax` (greedy with nothing that reshapes the logits, so a row's token
is the raw logits' argmax); `penalized` says whether the output history matters to the sampler.

Field names and meanings follow vLLM's `SamplingParams` so that a request sent to
the reference engine and to vLLM means the same thing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it means greedy
MIN_TEMPERATURE = 1e-2  # vLLM's _MAX_TEMP: a positive temperature below it is raised to it (no inf/nan)
MAX_LOGPROBS = 20  # vLLM's default max_logprobs (OpenAI's cap on top_logprobs)
# Every stop string is searched for after every token, and stop ids are looked up per token, in the
# engine's step loop, so a list of millions would stall every request in the batch. vLLM sets no cap
# (OpenAI and TGI allow 4); 128 is vLLM's cap on the similar bad_words list (VLLM_MAX_NUM_BAD_WORDS).
MAX_STOP = 128
INT64_MAX = 2**63 - 1  # top_k becomes an int64 tensor in the sampler


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # < SAMPLING_EPS (e.g. 0) => greedy
    top_p: float = 1.0  # in (0, 1]
    top_k: int = -1  # -1 or 0 => off
    min_p: float = 0.0  # in [0, 1]
    repetition_penalty: float = 1.0  # > 0; 1 => off (HF/vLLM semantics, prompt + output)
    presence_penalty: float = 0.0  # [-2, 2], output tokens only (OpenAI semantics)
    frequency_penalty: float = 0.0  # [-2, 2], output tokens only
    seed: int | None = None  # per-request generator: same result alone or batched
    stop: list[str] = field(default_factory=list)  # stop strings (excluded from text)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs per generated token (0 => only the chosen one)
    skip_special_tokens: bool = True
    min_tokens: int = 0  # no EOS, stop id or stop string ends the request before this many tokens
    include_stop_str_in_output: bool = False  # keep the stop string (and a stop id's text) in the text

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.temperature, (int, float)) and 0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE  # as vLLM: 1e-6 samples at 0.01, it is not greedy
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def penalized(self) -> bool:
        """Any repetition / presence / frequency penalty: the sampler reads the token history."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def argmax(self) -> bool:
        """Greedy and unpenalised: the token is the logits' argmax (unless min_tokens bans some ids)."""
        return self.greedy and not self.penalized

    def validate(self) -> None:
        """Raise ValueError naming the bad field; the request is then rejected alone."""
        def bad(msg: str) -> None:
            raise ValueError(msg)

        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not (0.0 <= self.temperature <= 2.0):
            bad(f"temperature must be in [0, 2], got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or not -1 <= self.top_k <= INT64_MAX:
            bad(f"top_k must be -1 (off), 0 (off) or a positive integer up to 2**63-1, got {self.top_k!r}")
        if not (0.0 <= self.min_p <= 1.0):
            bad(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not (self.repetition_penalty > 0.0):
            bad(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if not (-2.0 <= self.presence_penalty <= 2.0):
            bad(f"presence_penalty must be in [-2, 2], got {self.presence_penalty!r}")
        if not (-2.0 <= self.frequency_penalty <= 2.0):
            bad(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            bad(f"seed must be an integer, got {self.seed!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_LOGPROBS):
            bad(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or self.min_tokens < 0:
            bad(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            bad(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}")
        if len(self.stop) > MAX_STOP:
            bad(f"stop holds {len(self.stop)} strings; at most {MAX_STOP} are allowed")
        if any((not isinstance(s, str)) or s == "" for s in self.stop):
            bad("stop must be a list of non-empty strings")
        if len(self.stop_token_ids) > MAX_STOP:
            bad(f"stop_token_ids holds {len(self.stop_token_ids)} ids; at most {MAX_STOP} are allowed")
        if any((not isinstance(t, int)) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids must be non-negative integers")
