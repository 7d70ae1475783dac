"""What one client may make the server do: hostile input is refused with a 4xx, cheaply, and memory stays bounded.

Four layers, each refusing before the next one spends anything:

1. Connections (`idle_timeout_protocol`). uvicorn arms its keep-alive timer only once a response has
   been sent, so a connection that opens and never sends (or sends half a request head and stops) is
   held forever: a thousand of them hold a thousand sockets. Ours closes a connection that has not
   delivered a complete request head `--idle-timeout` seconds after it connected or after its last
   response. A request whose head has arrived is never cut by it (its body and its generation may take
   as long as they take).
2. Bodies (`BodyLimit`, pure ASGI). A body over `--max-request-bytes` gets 413 before any of it is
   parsed: a declared `Content-Length` over the limit is refused without reading a byte, and a body
   without one (chunked) is counted as it arrives and refused at the first byte past the limit; the
   rest is never read (the connection is closed after the 413). Responses pass through untouched, so
   SSE streams are not buffered.
3. Prompts (`check_text`, `check_ids`, `check_chat`). A prompt that cannot fit the context is refused
   before it is tokenized: vLLM's bound, `max_model_len * tokenizer.max_chars_per_token` characters (no
   token covers more characters than its longest vocabulary entry spells), so a 100 MB prompt costs a
   `len()`; pre-tokenized prompts are refused on their length alone. Chat messages are bounded by their
   total characters and by their number (every message costs at least one token of the template's).
   The bound is vLLM's and shares its one blind spot: a normalizer that composes characters (NFC) can
   fold several characters into one, so a prompt of long runs of combining marks could be refused
   although it would have fit (never the other way round).
4. Text the tokenizer cannot take. A JSON string may spell a lone UTF-16 surrogate (`"\\ud800"`),
   which Python keeps but UTF-8 and the Rust tokenizer refuse: such a prompt is a 400, not a 500.
   Control characters written as JSON escapes (`"\\u0000"`, `"\\u0001"`) are legal text and are
   tokenized like any other (as vLLM does); raw control bytes inside a JSON string, and bytes that are
   not UTF-8, are malformed JSON: 400 from the parser.

Fan-out (`n` x prompts over the admission gate), `logprobs` / `top_logprobs` (at most 20, vLLM's
max_logprobs) and `stop` / `stop_token_ids` lists (at most 128 each) are bounded where they are
validated: `Gate.check` and `SamplingParams.validate`.
"""
from __future__ import annotations

import re

from .errors import bad_request, error_response

# vLLM sets no body limit (uvicorn reads whatever comes); TGI's --payload-limit is 2 MB. A prompt that
# fills a 128k-token context is ~0.5 MB of text (~3 MB if every character is a JSON \\u escape) and
# ~1 MB as token ids, so 16 MiB is several times the largest request that can be served, while the
# worst body it admits (16M one-digit token ids) parses into a few hundred MB, not tens of GB.
DEFAULT_MAX_REQUEST_BYTES = 16 * 2**20
# nginx's client_header_timeout and Node's headersTimeout: 60 s to deliver a request head.
DEFAULT_IDLE_TIMEOUT_S = 60.0

_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins valid pairs: any left is a lone one


class _BodyTooLarge(Exception):
    pass


def positive(name: str, value):
    """`value` if it is > 0, else a ValueError naming the setting (a start-up error, exit 2)."""
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


class BodyLimit:
    """Pure ASGI middleware: 413 (the route's error shape) for a request body over `max_bytes`."""

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
        self.app, self.max_bytes = app, positive("max_request_bytes", max_bytes)

    def _refuse(self, scope, size: int | None):
        what = f" ({size} bytes)" if size is not None else ""
        return error_response(scope["path"], 413, f"the request body{what} is over this server's limit of "
                              f"{self.max_bytes} bytes (--max-request-bytes)", code="request_too_large",
                              headers={"Connection": "close"})  # the unread rest of the body is dropped

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(scope, int(declared))(scope, receive, send)
        seen, over, started = 0, False, False

        async def counted_receive():
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    over = True
                    raise _BodyTooLarge  # the app stops reading; whatever it answers is replaced below
            return message

        async def guarded_send(message):
            nonlocal started
            if over:
                return  # the app's answer to the failed read (FastAPI makes it a 400): ours is the 413
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not started:
            await self._refuse(scope, None)(scope, receive, send)


def idle_timeout_protocol(seconds: float, base: type | None = None) -> type:
    """uvicorn's HTTP protocol class (`base`: h11 or httptools, whichever uvicorn would pick) with a
    request-head timeout; give it to `uvicorn.Config(http=...)`."""
    positive("idle_timeout", seconds)
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base

    class IdleTimeoutProtocol(base):
        """Closes the connection unless a complete request head arrives within `seconds` of the connect
        or of the end of the previous response (uvicorn's own protocols share the attributes used here:
        `cycle`, `loop`, `transport`, `on_response_complete`)."""

        _head_timer = None

        def _in_request(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expire(self) -> None:
            self._head_timer = None
            if not self._in_request() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)  # a head that completes here starts a cycle
            if self._in_request():
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # may start a pipelined request's cycle
            if not self._in_request() and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return IdleTimeoutProtocol


# ---- prompts -------------------------------------------------------------------------------------


def prompt_char_limit(engine) -> int:
    """No prompt longer than this many characters fits the context (vLLM's bound, module docstring)."""
    return engine.max_model_len * engine.tokenizer.max_chars_per_token


def _too_long(engine, chars: int, what: str, param: str):
    L, limit = engine.max_model_len, prompt_char_limit(engine)
    return bad_request(f"This model's maximum context length is {L} tokens. However, your {what} contains {chars} "
                       f"characters (more than {limit} characters, which is the upper bound for {L} input "
                       "tokens). Please reduce the length of the input.", param)


def check_text(engine, text: str, param: str, what: str = "prompt") -> None:
    """Before tokenizing `text`: 400 if it cannot fit the context, or if the tokenizer cannot take it."""
    if len(text) > prompt_char_limit(engine):
        raise _too_long(engine, len(text), what, param)
    if (m := _SURROGATE.search(text)) is not None:
        raise bad_request(f"the {what} holds a lone UTF-16 surrogate (U+{ord(m.group()):04X} at character "
                          f"{m.start()}), which is not Unicode text", param)


def check_ids(engine, ids: list[int], param: str = "prompt") -> None:
    """A prompt of token ids (given, or just tokenized) must leave room for one token: 400 otherwise."""
    L = engine.max_model_len
    if len(ids) >= L:
        raise bad_request(f"This model's maximum context length is {L} tokens. However, your prompt has "
                          f"{len(ids)} tokens, which leaves no room for a completion. Please reduce the "
                          "length of the input.", param)


def check_stop_token_ids(engine, ids: list[int] | None) -> None:
    """Stop ids index the vocabulary in the sampler (min_tokens bans them): one outside it is a 400."""
    vocab = engine.model_config.vocab_size
    if ids and any(not 0 <= t < vocab for t in ids):
        raise bad_request(f"stop_token_ids must be token ids in [0, {vocab})", "stop_token_ids")


def check_chat(engine, messages: list[dict]) -> None:
    """Before rendering the template: the messages' total characters and their number must fit."""
    if len(messages) > engine.max_model_len:
        raise bad_request(f"{len(messages)} messages cannot fit the model's context of {engine.max_model_len} "
                          "tokens (each message takes at least one)", "messages")
    chars = sum(len(m["content"]) + len(m["role"]) + len(m.get("name") or "") for m in messages)
    if chars > prompt_char_limit(engine):
        raise _too_long(engine, chars, "messages' text", "messages")
