"""The front end's input processor: is this request servable by this engine? (vLLM validates in its
front end's `InputProcessor` too, `vllm/v1/engine/input_processor.py`, before the core sees a request.)

It needs no model and no runner: the vocabulary size, the context length, the KV capacity the core
reported when it started, and the step budget. `LLMEngine.add_request`, the offline `LLM`'s
all-or-nothing batch check and both async front ends (on the event loop) call the same `validate`.
The sampling params' own fields were checked when they were made (sampling_params.py); this checks
what depends on the request and the engine.
"""
from __future__ import annotations

from dataclasses import dataclass

from reference_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class InputProcessor:
    vocab_size: int
    max_model_len: int
    kv_capacity_tokens: int
    chunked_prefill: bool
    max_num_batched_tokens: int

    @classmethod
    def of(cls, cfg, vocab_size: int, max_model_len: int, kv_capacity_tokens: int) -> "InputProcessor":
        return cls(vocab_size, max_model_len, kv_capacity_tokens, cfg.enable_chunked_prefill,
                   cfg.max_num_batched_tokens)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError naming what is wrong; nothing is queued on failure."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be SamplingParams, got {type(params).__name__}")
        if not prompt_token_ids:
            raise ValueError("prompt is empty: at least one token is required")
        vocab = self.vocab_size
        if any((not isinstance(t, int)) or t < 0 or t >= vocab for t in prompt_token_ids):
            raise ValueError(f"prompt contains token ids outside the vocabulary [0, {vocab})")
        if any(t >= vocab for t in params.stop_token_ids or ()):  # banned under min_tokens: an index into the logits
            raise ValueError(f"stop_token_ids contains ids outside the vocabulary [0, {vocab})")
        n, m = len(prompt_token_ids), params.max_tokens
        if n + m > self.max_model_len:
            raise ValueError(f"prompt ({n} tokens) + max_tokens ({m}) = {n + m} exceeds the model's "
                             f"context length of {self.max_model_len} tokens")
        if n + m > self.kv_capacity_tokens:
            raise ValueError(f"prompt ({n} tokens) + max_tokens ({m}) exceeds the KV cache capacity "
                             f"of {self.kv_capacity_tokens} tokens; raise kv_cache_tokens")
        if not self.chunked_prefill and n + m > self.max_num_batched_tokens:
            raise ValueError(f"without chunked prefill, prompt + max_tokens must fit max_num_batched_tokens "
                             f"({self.max_num_batched_tokens})")
