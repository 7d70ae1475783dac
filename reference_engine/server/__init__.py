"""`python -m reference_engine.server` (or `inferlab serve`): the reference engine behind OpenAI- and
TGI-compatible HTTP routes. It drives the engine through an `EngineClient`'s API only (`AsyncEngine` or
`ProcessAsyncEngine`, engine/client.py).

Modules: app (app factory, auth, lifecycle), openai_routes / openai_format, tgi_routes,
protocol (request bodies), generation (engine requests per HTTP request: admission gate,
abort on disconnect, latency observation), sse, metrics (vLLM-named Prometheus), errors,
limits (body size, idle connections, the prompt's character bound), cli (flags, exit codes, signals).

Owns: HTTP (routes, request bodies, SSE, auth, admission, Prometheus names). Never touches the
engine's internals (scheduler, runner, KV cache): only the `EngineClient` API. See docs/architecture.md.
"""
from reference_engine.server.app import build_app

__all__ = ["build_app"]
