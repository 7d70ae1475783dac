"""The FastAPI app: `build_app(engine, api_key=None, max_waiting=..., max_request_bytes=...)`.

The app owns the engine's lifecycle: startup awaits `engine.start()` (uvicorn accepts
connections only after that, so `/health` answering means the model is loaded), shutdown
awaits `engine.shutdown()` after uvicorn has drained in-flight requests (graceful SIGTERM).
When `api_key` is set, every route but `/health` and `/metrics` (`OPEN_PATHS`, what a load balancer
and a Prometheus scraper call) needs `Authorization: Bearer KEY` (401 otherwise): /version and the
OpenAPI docs included. vLLM 0.32 checks the key only under /v1, /v2, /inference and /cohere and says in
its own --help that everything else stays open; here a TGI route or /reset_prefix_cache must not be.
A body over `max_request_bytes` gets 413 before it is parsed (`limits.BodyLimit`).
"""
from __future__ import annotations

import hmac
from contextlib import asynccontextmanager

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response

from . import errors, limits, openai_routes, tgi_routes
from .generation import Gate
from .metrics import CONTENT_TYPE, ServerMetrics
from .state import ServerState, get_state

DEFAULT_MAX_WAITING = 256
OPEN_PATHS = frozenset({"/health", "/metrics"})


class APIKeyMiddleware:
    """Pure ASGI (no response buffering, so SSE streams pass straight through)."""

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and scope["method"] != "OPTIONS":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):  # constant time: no key guessing by timing
                resp = errors.error_response(scope["path"], 401, "invalid or missing API key",
                                             code="invalid_api_key")
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


async def _core_call(call):
    """A control call into the engine core: a core that is dead or does not answer in time is a 503."""
    try:
        return await call
    except (TimeoutError, RuntimeError) as e:
        raise errors.APIError(str(e), 503, code="engine_unavailable") from None


def build_app(engine, api_key: str | None = None, max_waiting: int = DEFAULT_MAX_WAITING,
              served_model_name: str | None = None, chat_template: str | None = None,
              max_request_bytes: int = limits.DEFAULT_MAX_REQUEST_BYTES) -> FastAPI:
    """`chat_template`: vLLM's `--chat-template` (a file or the template itself), over the model's own."""
    gate = Gate(max_waiting)  # validates max_waiting now, before anything starts
    if chat_template is not None:  # a missing file is a start-up error, not a 400 on every chat request
        from reference_engine.tokenizer.tokenizer import resolve_chat_template

        chat_template = resolve_chat_template(engine.config.model, {}, override=chat_template)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await engine.start()
        if chat_template is not None:
            engine.tokenizer.chat_template = chat_template
        name = served_model_name or str(engine.config.model)  # the model argument as given, as in vLLM
        app.state.server = ServerState(engine=engine, gate=gate, served_name=name,
                                       metrics=ServerMetrics(engine, name),
                                       aliases={engine.model_name, str(engine.config.model)})
        try:
            yield
        finally:
            await engine.shutdown()

    app = FastAPI(title="inferlab reference engine", version=getattr(engine, "version", "0"),
                  lifespan=lifespan, docs_url="/docs", redoc_url=None)
    errors.install(app)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    # added last: the outermost; the size is checked now, a bad one is a start-up error
    app.add_middleware(limits.BodyLimit, max_bytes=limits.positive("max_request_bytes", max_request_bytes))
    app.include_router(openai_routes.router)
    app.include_router(tgi_routes.router)

    @app.get("/health")
    async def health(request: Request) -> Response:
        # 503 once the engine's step loop has died: a load balancer should stop sending here.
        return Response(status_code=200 if get_state(request).engine.is_alive else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(get_state(request).metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/reset_prefix_cache", include_in_schema=False)  # an admin route: no body, nothing to fuzz
    async def reset_prefix_cache(request: Request, reset_running_requests: bool = Query(False)) -> Response:
        # vLLM's route: 200 once reset, 409 while requests hold blocks (unless reset_running_requests).
        # Awaited: the reset runs between two steps while the event loop keeps serving.
        if await _core_call(get_state(request).engine.reset_prefix_cache(reset_running_requests)):
            return Response(status_code=200)
        raise errors.APIError("Prefix cache reset failed: requests still hold KV blocks.", 409, code="conflict")

    @app.get("/server_info", include_in_schema=False)  # as vLLM's (dev mode): what the engine runs with
    async def server_info(request: Request) -> dict:
        engine = get_state(request).engine
        return {"effective": engine.effective_config(), "memory": await _core_call(engine.memory_report())}

    @app.get("/version")
    async def version(request: Request) -> dict:
        return {"version": get_state(request).engine.version}

    return app
