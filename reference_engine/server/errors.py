"""Error bodies: OpenAI shape on OpenAI routes, TGI shape on TGI routes.

Invariant: bad input never surfaces as a 5xx. Every rejection is an `APIError` (or a
FastAPI validation error, converted here) carrying a 4xx status; only a bug in the server
or the engine produces a 500, and that still gets a well-formed JSON body.
"""
from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

# Paths that speak TGI (errors as {"error": str, "error_type": str}); everything else speaks OpenAI.
TGI_PATHS = frozenset({"/", "/generate", "/generate_stream", "/info", "/tokenize"})

# OpenAI `type` per status; TGI `error_type` per status (TGI answers validation errors with 422).
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 405: "invalid_request_error", 413: "invalid_request_error",
                 422: "invalid_request_error", 429: "rate_limit_error", 503: "service_unavailable"}
_TGI_TYPES = {401: "authentication", 422: "validation", 429: "overloaded", 503: "overloaded"}


class APIError(Exception):
    """A request the server refuses; `status` is what the client sees."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code
        self.headers = headers or {}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(message, 400, param=param)


def from_value_error(err: ValueError, fields: tuple[str, ...] = ()) -> APIError:
    """Engine/SamplingParams errors name the field first ("max_tokens must be ..."): recover it as `param`."""
    msg = str(err)
    first = msg.split(" ", 1)[0]
    return bad_request(msg, param=first if first in fields else None)


def is_tgi(path: str) -> bool:
    return path in TGI_PATHS


def _printable(text: str | None) -> str | None:
    """Messages may quote the client's input, which may hold lone surrogates (`"\\ud800"` in JSON)
    that UTF-8 cannot encode: the response would fail to render (a 500). Spell them as escapes."""
    return text if text is None or text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(path: str, status: int, message: str, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    message, param = _printable(message), _printable(param)
    if is_tgi(path):
        # TGI answers validation failures with 422 and a full queue with 429; keep its codes on its routes.
        status = {400: 422, 503: 429}.get(status, status)
        body = {"error": message, "error_type": _TGI_TYPES.get(status, "generation" if status >= 500 else "validation")}
    else:
        err_type = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _loc(loc: tuple) -> str:
    # ("body", "messages", 0, "role") -> "messages.0.role"; the "body" prefix says nothing to a client.
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts)


async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
    return error_response(request.url.path, exc.status, exc.message, exc.param, exc.code, exc.headers)


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return error_response(request.url.path, 400, f"malformed JSON body: {first.get('ctx', {}).get('error', '')}")
    else:
        msg = "; ".join(f"{_loc(e.get('loc', ())) or 'body'}: {e.get('msg', 'invalid')}" for e in errors[:5])
    return error_response(request.url.path, 400, msg or "invalid request", param=_loc(first.get("loc", ())) or None)


async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(request.url.path, exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # A bug, not bad input: report it plainly and keep serving.
    return error_response(request.url.path, 500, f"internal error: {type(exc).__name__}: {exc}")


def install(app) -> None:
    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
