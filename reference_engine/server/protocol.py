"""Request bodies the server accepts (pydantic), OpenAI + vLLM extras and TGI.

Types are checked here; value ranges are checked once, by `SamplingParams.validate`, so the
server and the offline API reject exactly the same settings. `null` means "the default", as
in vLLM. Unknown fields are ignored (OpenAI clients send fields we do not use); fields we know
but do not implement (echo, best_of > 1, logit_bias, suffix, ...) are rejected with a message.
Non-finite floats (JSON `NaN` / `Infinity`, which Python's parser accepts) are rejected.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# torch.Generator.manual_seed accepts a 64-bit seed; keep to the signed range (vLLM's too).
_SEED = dict(ge=-(2**63), le=2**63 - 1)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SamplingFields(_Body):
    """Sampling settings shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    n: int = Field(1, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = Field(None, **_SEED)
    stop: str | list[str] | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM extra fields (accepted in the body, as `extra_body=` in the openai client)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = True
    min_tokens: int | None = None
    include_stop_str_in_output: bool | None = None
    return_token_ids: bool | None = False
    cache_salt: str | None = None  # prefix-cache isolation: only requests with the same salt share blocks

    def sampling_kwargs(self) -> dict[str, Any]:
        """SamplingParams keyword arguments for the fields the client set (None = engine default)."""
        names = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens",
                 "min_tokens", "include_stop_str_in_output")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}

    def unsupported(self) -> str | None:
        """Name a known-but-unimplemented setting the client asked for, else None."""
        if self.logit_bias:
            return "logit_bias"
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None
    add_special_tokens: bool | None = True

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo"
        if self.best_of not in (None, 1):
            return "best_of"
        if self.suffix:
            return "suffix"
        return super().unsupported()


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # default: the rest of the context
    max_completion_tokens: int | None = None  # OpenAI's newer name; wins over max_tokens
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool | None = True
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> str | None:
        if self.tools:
            return "tools"
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            return "response_format"
        return super().unsupported()


# ---- TGI ---------------------------------------------------------------------------------------


class TGIParameters(_Body):
    """TGI's GenerateParameters; sampling is on when do_sample or any warper is set (TGI's rule).
    Strict types, as TGI's serde parsing is: `watermark: 0` or `repetition_penalty: true` is a 422."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    best_of: int | None = None
    decoder_input_details: bool = False
    details: bool = False
    do_sample: bool = False
    frequency_penalty: float | None = None
    max_new_tokens: int | None = None
    repetition_penalty: float | None = None
    return_full_text: bool | None = False
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: list[str] = Field(default_factory=list)
    temperature: float | None = None
    top_k: int | None = None
    top_n_tokens: int | None = None
    top_p: float | None = None
    truncate: int | None = None
    typical_p: float | None = None
    watermark: bool = False
    grammar: dict[str, Any] | None = None
    adapter_id: str | None = None


class TGIRequest(_Body):
    inputs: str
    parameters: TGIParameters = Field(default_factory=TGIParameters)


class TGICompatRequest(TGIRequest):
    stream: bool = False


class TokenizeRequest(_Body):
    """TGI's /tokenize body; strict like `TGIParameters` (serde takes no `0.0` for a bool)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)
    inputs: str
    add_special_tokens: bool = True
