"""OpenAI response pieces: logprobs in both OpenAI formats, usage, finish/stop reasons.

Token strings are the single-token decode with special tokens kept (`decode([id], False)`),
which is what vLLM shows in `tokens` / `top_logprobs` as well.
"""
from __future__ import annotations

from reference_engine.outputs import TokenLogprob


def token_text(tok, token_id: int) -> str:
    return tok.decode([token_id], skip_special_tokens=False)


def completion_logprobs(tok, lps: list[TokenLogprob], offset: int) -> dict:
    """Completions format: parallel lists; `text_offset` counts characters from `offset` on."""
    out = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for lp in lps:
        t = token_text(tok, lp.token_id)
        top: dict[str, float] = {}
        # Keyed by text, so distinct ids may collide (e.g. byte tokens that each decode to U+FFFD):
        # the most likely id keeps the key. The chosen token is always listed (vLLM).
        for i, v in sorted(lp.top.items(), key=lambda kv: -kv[1]):
            top.setdefault(token_text(tok, i), v)
        top.setdefault(t, lp.logprob)
        out["text_offset"].append(offset)
        out["token_logprobs"].append(lp.logprob)
        out["tokens"].append(t)
        out["top_logprobs"].append(top)
        offset += len(t)
    return out


def _entry(t: str, logprob: float) -> dict:
    return {"token": t, "logprob": logprob, "bytes": list(t.encode("utf-8"))}


def chat_logprobs(tok, lps: list[TokenLogprob], top_n: int) -> dict:
    """Chat format: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""
    content = []
    for lp in lps:
        e = _entry(token_text(tok, lp.token_id), lp.logprob)
        ranked = sorted(lp.top.items(), key=lambda kv: -kv[1])[:top_n]
        e["top_logprobs"] = [_entry(token_text(tok, i), v) for i, v in ranked]
        content.append(e)
    return {"content": content}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
