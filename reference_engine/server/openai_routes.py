"""OpenAI routes: /v1/models, /v1/completions, /v1/chat/completions (JSON or SSE).

Streams follow OpenAI/vLLM: one `data: {chunk}` per engine delta (a delta may carry several
tokens), `data: [DONE]` last; with `stream_options.include_usage` every chunk has
`"usage": null` (the running totals with vLLM's `continuous_usage_stats`) and one extra chunk
with `"choices": []` carries the usage. Chat streams open
with a `{"role": "assistant", "content": ""}` delta per choice.

Token ids (vLLM >= 0.10 extension): with `"return_token_ids": true` completions choices carry
`token_ids` (and `prompt_token_ids`); chat choices carry `token_ids` and the response carries
`prompt_token_ids`. When streaming, `token_ids` holds each chunk's new ids and
`prompt_token_ids` rides on the first chunk of each choice (completions) / the first chunk (chat).
"""
from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from reference_engine.sampling_params import MAX_LOGPROBS, SamplingParams

from . import limits
from . import openai_format as fmt
from .errors import bad_request, from_value_error
from .generation import SAMPLING_FIELDS, Choices, Choice, run_whole
from .protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from .sse import DONE, SSEResponse, event
from .state import ServerState, get_state

router = APIRouter()
CLIENT_GONE = 499  # nginx's code: the client closed the connection before the answer


def _params(st: ServerState, req: SamplingFields, max_tokens: int, logprobs: int | None) -> SamplingParams:
    if (name := req.unsupported()) is not None:
        raise bad_request(f"`{name}` is not supported by this server", name)
    limits.check_stop_token_ids(st.engine, req.stop_token_ids)
    kw = req.sampling_kwargs() | {"max_tokens": max_tokens}
    if logprobs is not None:
        kw["logprobs"] = logprobs
    try:
        return SamplingParams(**kw)
    except ValueError as err:
        raise from_value_error(err, SAMPLING_FIELDS) from None


def _prompts(st: ServerState, req: CompletionRequest) -> list[list[int]]:
    """prompt: str | list[int] | list[str] | list[list[int]] -> one id list per prompt, none empty.
    Every cheap bound (count, characters, ids) is checked before the first prompt is tokenized."""
    raw = req.prompt
    items = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else list(raw)
    if not items:
        raise bad_request("prompt must not be empty", "prompt")
    st.gate.check(len(items) * req.n)
    for item in items:
        if isinstance(item, str):
            limits.check_text(st.engine, item, "prompt")
        else:
            limits.check_ids(st.engine, item)
    out = []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise bad_request("prompt must not be empty", "prompt")
            item = st.engine.tokenizer.encode(item, add_special_tokens=bool(req.add_special_tokens))
            limits.check_ids(st.engine, item)
        if not item:
            raise bad_request("prompt must not be empty", "prompt")
        out.append(list(item))
    return out


def _chat_prompt(st: ServerState, req: ChatCompletionRequest) -> list[int]:
    messages = []
    for m in req.messages:
        content = m.content
        if isinstance(content, list):
            if any(p.type != "text" or p.text is None for p in content):
                raise bad_request("only text content parts are supported", "messages")
            content = "\n".join(p.text for p in content)  # vLLM's "string" content format
        msg = {"role": m.role, "content": content or ""}
        if m.name:
            msg["name"] = m.name
        messages.append(msg)
    limits.check_chat(st.engine, messages)
    try:
        text = st.engine.tokenizer.apply_chat_template(messages, add_generation_prompt=bool(req.add_generation_prompt))
    except Exception as err:  # jinja raises its own types; any template failure is the request's fault
        raise bad_request(f"could not apply the chat template: {err}", "messages") from None
    limits.check_text(st.engine, text, "messages", what="rendered chat")
    ids = st.engine.tokenizer.encode(text, add_special_tokens=False)  # the template already placed BOS
    if not ids:
        raise bad_request("the chat template produced an empty prompt", "messages")
    return ids


def _chunk_usage(req: SamplingFields, group: Choices) -> dict:
    """Per-chunk `usage`: absent unless include_usage; null, or the running totals with continuous_usage_stats."""
    if not req.include_usage:
        return {}
    live = req.stream_options.continuous_usage_stats
    return {"usage": fmt.usage(group.num_prompt_tokens, group.num_completion_tokens) if live else None}


def _head(group: Choices, obj: str, st: ServerState, created: int) -> dict:
    return {"id": group.id, "object": obj, "created": created, "model": st.served_name}


async def _respond(request: Request, group: Choices, stream_body, whole_body):
    """Stream (SSE, abort on disconnect) or wait for everything (abort if the client leaves)."""
    if stream_body is not None:
        return SSEResponse(stream_body, on_close=group.close)
    if await run_whole(request, group) is None:
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(whole_body())


def _stream_end(req, group: Choices, head: dict) -> list[str]:
    """The last SSE events: the usage chunk when `stream_options.include_usage`, then [DONE]."""
    usage = [event(head | {"choices": [], "usage": fmt.usage(group.num_prompt_tokens, group.num_completion_tokens)})]
    return (usage if req.include_usage else []) + [DONE]


async def _guard(gen):
    """Errors after the 200 went out can only travel as an SSE event; then [DONE]."""
    try:
        async for chunk in gen:
            yield chunk
    except Exception as err:
        yield event({"error": {"message": f"generation failed: {err}", "type": "server_error",
                                 "param": None, "code": None}})
        yield DONE


@router.get("/v1/models")
async def models(request: Request) -> dict:
    st = get_state(request)
    return {"object": "list", "data": [{
        "id": st.served_name, "object": "model", "created": 0, "owned_by": "inferlab",
        "root": st.engine.config.model, "parent": None, "max_model_len": st.engine.max_model_len}]}


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request):
    st = get_state(request)
    st.check_model(req.model)
    params = _params(st, req, req.max_tokens if req.max_tokens is not None else 16, req.logprobs)
    group = Choices(st, _prompts(st, req), params, n=req.n, prefix="cmpl", cache_salt=req.cache_salt)
    created, tok, ids = int(time.time()), st.engine.tokenizer, bool(req.return_token_ids)

    def choice_json(c: Choice) -> dict:
        d = {"index": c.index, "text": c.text, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
             "logprobs": fmt.completion_logprobs(tok, c.logprobs, 0) if req.logprobs is not None else None}
        if ids:
            d |= {"token_ids": c.token_ids, "prompt_token_ids": c.prompt_ids}
        return d

    def whole() -> dict:
        return _head(group, "text_completion", st, created) | {
            "choices": [choice_json(c) for c in group.choices],
            "usage": fmt.usage(group.num_prompt_tokens, group.num_completion_tokens)}

    async def chunks():
        head = _head(group, "text_completion", st, created)
        first: set[int] = set()
        async for c, d in group.deltas():
            if not (d.new_token_ids or d.text_delta or d.finished):
                continue
            ch = {"index": c.index, "text": d.text_delta,
                  "logprobs": (fmt.completion_logprobs(tok, d.logprobs or [], len(c.text) - len(d.text_delta))
                               if req.logprobs is not None else None),
                  "finish_reason": c.finish_reason if d.finished else None,
                  "stop_reason": c.stop_reason if d.finished else None}
            if ids:
                ch["token_ids"] = d.new_token_ids
                if c.index not in first:
                    first.add(c.index)
                    ch["prompt_token_ids"] = c.prompt_ids
            yield event(head | {"choices": [ch]} | _chunk_usage(req, group))
        for tail in _stream_end(req, group, head):
            yield tail

    return await _respond(request, group, _guard(chunks()) if req.stream else None, whole)


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request):
    st = get_state(request)
    st.check_model(req.model)
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
        raise bad_request(f"`top_logprobs` must be in [0, {MAX_LOGPROBS}], got {req.top_logprobs}", "top_logprobs")
    if req.top_logprobs and not req.logprobs:  # vLLM's rule: asked-for alternatives must not be dropped silently
        raise bad_request("when using `top_logprobs`, `logprobs` must be set to true", "top_logprobs")
    st.gate.check(req.n)
    prompt = _chat_prompt(st, req)
    room = st.engine.max_model_len - len(prompt)
    if room < 1:
        raise bad_request(f"the prompt ({len(prompt)} tokens) leaves no room in the model's context of "
                          f"{st.engine.max_model_len} tokens", "messages")
    max_tokens = next((v for v in (req.max_completion_tokens, req.max_tokens) if v is not None), room)
    top_n = req.top_logprobs or 0
    params = _params(st, req, max_tokens, top_n if req.logprobs else None)
    group = Choices(st, [prompt], params, n=req.n, prefix="chatcmpl", cache_salt=req.cache_salt)
    created, tok, ids = int(time.time()), st.engine.tokenizer, bool(req.return_token_ids)

    def lp(lps) -> dict | None:
        return fmt.chat_logprobs(tok, lps or [], top_n) if req.logprobs else None

    def whole() -> dict:
        choices = []
        for c in group.choices:
            d = {"index": c.index, "message": {"role": "assistant", "content": c.text},
                 "logprobs": lp(c.logprobs), "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            choices.append(d | ({"token_ids": c.token_ids} if ids else {}))
        body = _head(group, "chat.completion", st, created) | {
            "choices": choices, "usage": fmt.usage(group.num_prompt_tokens, group.num_completion_tokens)}
        return body | ({"prompt_token_ids": prompt} if ids else {})

    async def chunks():
        head = _head(group, "chat.completion.chunk", st, created)
        for i, c in enumerate(group.choices):  # role first, before any token (as vLLM)
            first = {"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}
            extra = {"prompt_token_ids": prompt} if ids and i == 0 else {}
            yield event(head | {"choices": [first]} | _chunk_usage(req, group) | extra)
        async for c, d in group.deltas():
            if not (d.new_token_ids or d.text_delta or d.finished):
                continue
            ch = {"index": c.index, "delta": {"content": d.text_delta} if d.text_delta or not d.finished else {},
                  "logprobs": lp(d.logprobs), "finish_reason": c.finish_reason if d.finished else None,
                  "stop_reason": c.stop_reason if d.finished else None}
            if ids:
                ch["token_ids"] = d.new_token_ids
            yield event(head | {"choices": [ch]} | _chunk_usage(req, group))
        for tail in _stream_end(req, group, head):
            yield tail

    return await _respond(request, group, _guard(chunks()) if req.stream else None, whole)
