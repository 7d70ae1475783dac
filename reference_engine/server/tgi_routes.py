"""TGI routes: /generate, /generate_stream, / (dispatch on `stream`), /info, /tokenize.

Shapes follow text-generation-inference's router so `huggingface_hub.InferenceClient`
(and our TGI adapter) work unchanged:
- stream events `{"index": i (1-based), "token": {id, text, logprob, special}, "generated_text": null,
  "details": null}`; the last carries `generated_text` and, when `details` was asked for,
  `{"finish_reason": "length"|"eos_token"|"stop_sequence", "generated_tokens", "seed", "input_length"}`.
  No `[DONE]` (TGI sends none).
- errors `{"error": str, "error_type": "validation"|"overloaded"|...}`: 422 validation, 429 queue full.
- sampling is on when `do_sample` or any of temperature/top_k/top_p/typical_p is set (TGI's rule);
  otherwise greedy. A sampled request without a seed gets a random one, reported in `details.seed`.
- `max_new_tokens` defaults to min(context - input, 1024), TGI's default.

Not implemented (rejected with 422): best_of > 1, decoder_input_details, watermark, grammar,
adapter_id, typical_p.
"""
from __future__ import annotations

import random

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from reference_engine.sampling_params import SamplingParams

from . import limits
from .errors import bad_request, from_value_error
from .generation import SAMPLING_FIELDS, Choices, Choice, run_whole
from .openai_routes import CLIENT_GONE
from .protocol import TGICompatRequest, TGIParameters, TGIRequest, TokenizeRequest
from .sse import SSEResponse, event
from .state import ServerState, get_state

router = APIRouter()
DEFAULT_MAX_NEW_TOKENS = 1024  # TGI's DEFAULT_GENERATION_LENGTH
MAX_STOP_SEQUENCES = 4  # TGI's default --max-stop-sequences


def _params(st: ServerState, p: TGIParameters, input_len: int) -> tuple[SamplingParams, int | None]:
    for name, on in (("best_of", p.best_of not in (None, 1)), ("decoder_input_details", p.decoder_input_details),
                     ("watermark", p.watermark), ("grammar", p.grammar is not None),
                     ("adapter_id", p.adapter_id is not None), ("typical_p", p.typical_p is not None)):
        if on:
            raise bad_request(f"`{name}` is not supported by this server", name)
    if p.temperature is not None and p.temperature <= 0:
        raise bad_request("`temperature` must be strictly positive", "temperature")
    if p.top_p is not None and not 0 < p.top_p < 1:
        raise bad_request("`top_p` must be > 0.0 and < 1.0", "top_p")
    if p.top_k is not None and p.top_k <= 0:
        raise bad_request("`top_k` must be strictly positive", "top_k")
    if p.max_new_tokens is not None and p.max_new_tokens <= 0:
        raise bad_request("`max_new_tokens` must be strictly positive", "max_new_tokens")
    if len(p.stop) > MAX_STOP_SEQUENCES:
        raise bad_request(f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(p.stop)}", "stop")
    sampling = p.do_sample or any(v is not None for v in (p.temperature, p.top_k, p.top_p))
    seed = p.seed if p.seed is not None or not sampling else random.randrange(2**63)
    room = st.engine.max_model_len - input_len
    max_new = p.max_new_tokens if p.max_new_tokens is not None else max(1, min(room, DEFAULT_MAX_NEW_TOKENS))
    try:
        params = SamplingParams(
            max_tokens=max_new, temperature=(p.temperature or 1.0) if sampling else 0.0,
            top_p=p.top_p or 1.0, top_k=p.top_k or -1, seed=seed, stop=p.stop,
            repetition_penalty=p.repetition_penalty if p.repetition_penalty is not None else 1.0,
            frequency_penalty=p.frequency_penalty if p.frequency_penalty is not None else 0.0,
            logprobs=p.top_n_tokens or 0)  # TGI always reports each token's logprob
    except ValueError as err:
        raise from_value_error(err, SAMPLING_FIELDS) from None
    return params, (seed if sampling else None)


def _input_ids(st: ServerState, req: TGIRequest) -> list[int]:
    """With `truncate`, an input over the character bound is cut to its last `prompt_char_limit`
    characters before tokenizing (vLLM's pre-trim for left truncation: those characters are at least
    `max_model_len` tokens, more than `truncate` keeps); without it, such an input is refused."""
    if not req.inputs:
        raise bad_request("`inputs` cannot be empty", "inputs")
    t, text = req.parameters.truncate, req.inputs
    if t is not None:
        if not 0 < t < st.engine.max_model_len:
            raise bad_request(f"`truncate` must be strictly positive and less than {st.engine.max_model_len}. "
                              f"Given: {t}", "truncate")
        text = text[-limits.prompt_char_limit(st.engine):]
    limits.check_text(st.engine, text, "inputs", what="input")
    ids = st.engine.tokenizer.encode(text, add_special_tokens=True)
    if t is not None:
        ids = ids[-t:]  # TGI keeps the last `truncate` tokens
    limits.check_ids(st.engine, ids, "inputs")
    return ids


def _token(tok, token_id: int, logprob: float | None, text: str | None = None) -> dict:
    special = tok.is_special(token_id)
    if text is None or special:
        text = tok.decode([token_id], skip_special_tokens=False)
    return {"id": token_id, "text": text, "logprob": logprob, "special": special}


def _top(tok, lp) -> list[dict]:
    return [_token(tok, i, v) for i, v in sorted(lp.top.items(), key=lambda kv: -kv[1])]


def _finish(c: Choice) -> str:
    if c.finish_reason == "length":
        return "length"
    return "stop_sequence" if isinstance(c.stop_reason, str) else "eos_token"


def _start(st: ServerState, req: TGIRequest) -> tuple[Choices, int | None, int]:
    ids = _input_ids(st, req)
    params, seed = _params(st, req.parameters, len(ids))
    return Choices(st, [ids], params, prefix="tgi"), seed, len(ids)


async def _generate(st: ServerState, req: TGIRequest, request: Request, as_list: bool):
    group, seed, input_len = _start(st, req)
    choices = await run_whole(request, group)
    if choices is None:
        return Response(status_code=CLIENT_GONE)
    c, p, tok = choices[0], req.parameters, st.engine.tokenizer
    if c.finish_reason == "abort":
        return JSONResponse({"error": "Request failed during generation: aborted", "error_type": "generation"}, 424)
    body = {"generated_text": (req.inputs if p.return_full_text else "") + c.text}
    if p.details:
        lps = c.logprobs or [None] * len(c.token_ids)
        body["details"] = {
            "finish_reason": _finish(c), "generated_tokens": len(c.token_ids), "seed": seed, "prefill": [],
            "tokens": [_token(tok, t, lp.logprob if lp else None) for t, lp in zip(c.token_ids, lps)],
            "top_tokens": [_top(tok, lp) for lp in lps if lp] if p.top_n_tokens else None}
    headers = {"x-prompt-tokens": str(input_len), "x-generated-tokens": str(len(c.token_ids))}
    return JSONResponse([body] if as_list else body, headers=headers)


def _stream(st: ServerState, req: TGIRequest) -> SSEResponse:
    group, seed, input_len = _start(st, req)
    p, tok = req.parameters, st.engine.tokenizer

    async def events():
        index = 0
        last: dict | None = None
        try:
            async for c, d in group.deltas():
                if d.finish_reason == "abort":
                    yield event({"error": "Request failed during generation: aborted", "error_type": "generation"})
                    return
                lps = d.logprobs or [None] * len(d.new_token_ids)
                for k, (t, lp) in enumerate(zip(d.new_token_ids, lps)):
                    index += 1
                    text = d.text_delta if len(d.new_token_ids) == 1 else None
                    last = {"index": index, "token": _token(tok, t, lp.logprob if lp else None, text),
                            "generated_text": None, "details": None}
                    if p.top_n_tokens and lp:
                        last["top_tokens"] = _top(tok, lp)
                    if not (d.finished and k == len(d.new_token_ids) - 1):
                        yield event(last)
                if d.finished and last is not None:
                    # TGI's End event: the last token plus the whole text and the details.
                    last["generated_text"] = (req.inputs if p.return_full_text else "") + c.text
                    if p.details:
                        last["details"] = {"finish_reason": _finish(c), "generated_tokens": len(c.token_ids),
                                           "seed": seed, "input_length": input_len}
                    yield event(last)
        except Exception as err:
            yield event({"error": f"Request failed during generation: {err}", "error_type": "generation"})

    return SSEResponse(events(), on_close=group.close)


@router.post("/generate")
async def generate(req: TGIRequest, request: Request):
    return await _generate(get_state(request), req, request, as_list=False)


@router.post("/generate_stream")
async def generate_stream(req: TGIRequest, request: Request):
    return _stream(get_state(request), req)


@router.post("/")
async def compat_generate(req: TGICompatRequest, request: Request):
    """TGI's compat route: a stream when `stream` is true, else a one-element list (api-inference shape)."""
    st = get_state(request)
    return _stream(st, req) if req.stream else await _generate(st, req, request, as_list=True)


@router.get("/info")
async def info(request: Request) -> dict:
    """TGI v3's /info field set (router/src/lib.rs `Info` at v3.3.7): since v2.3.0 it carries no
    dtype and no group-token budget, so neither do we (a client must not learn here what real TGI
    would not tell it)."""
    st = get_state(request)
    L = st.engine.max_model_len
    return {"model_id": st.served_name, "model_sha": None, "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": st.gate.limit, "max_best_of": 1, "max_stop_sequences": MAX_STOP_SEQUENCES,
            "max_input_tokens": L - 1, "max_total_tokens": L, "validation_workers": 1,
            "max_client_batch_size": 1, "router": "inferlab-reference-engine", "version": st.engine.version,
            "sha": None, "docker_label": None}


@router.post("/tokenize")
async def tokenize(req: TokenizeRequest, request: Request) -> list[dict]:
    """TGI's tokenize: [{id, text, start, stop}], offsets being character positions in `inputs`."""
    st = get_state(request)
    limits.check_text(st.engine, req.inputs, "inputs", what="input")
    ids, offsets = st.engine.tokenizer.encode_with_offsets(req.inputs, add_special_tokens=req.add_special_tokens)
    if len(ids) > st.engine.max_model_len:
        raise bad_request(f"`inputs` is {len(ids)} tokens, more than the context of {st.engine.max_model_len}",
                          "inputs")
    return [{"id": t, "text": req.inputs[a:b], "start": a, "stop": b} for t, (a, b) in zip(ids, offsets)]
