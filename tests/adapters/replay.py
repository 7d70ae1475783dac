"""A real HTTP server on 127.0.0.1 that answers routes with recorded engine responses.

It stands in for an engine that cannot run on this machine (SGLang, TensorRT-LLM, TGI need
a GPU host): the bytes it sends are the fixtures recorded from the real engine, so an
adapter is tested on what that engine really puts on the wire. It records every request
(method, path, JSON body) so tests can assert what the adapter sent.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(*parts: str) -> bytes:
    return FIXTURES.joinpath(*parts).read_bytes()


def facts(engine: str) -> dict[str, Any]:
    """fixtures/<engine>/facts.json: facts read from upstream's source, each entry with its
    `source` (file @ commit or tag; SOURCE.md beside it says more)."""
    return json.loads(fixture(engine, "facts.json"))


class Replay:
    """routes: {(METHOD, path): (status, content_type, body bytes)}, or a callable taking the
    request's JSON body and returning that triple (to answer as a recorded fact says, e.g. 400
    for a field the engine's request model forbids); anything else → 404."""

    def __init__(self, routes: dict[tuple[str, str], tuple[int, str, bytes]]):
        self.routes = routes
        self.requests: list[tuple[str, str, Any]] = []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                path = self.path.split("?")[0]
                replay.requests.append((method, path, body))
                answer = replay.routes.get((method, path), (404, "text/plain", b"not found"))
                status, ctype, data = answer(body) if callable(answer) else answer
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def posted(self, path: str) -> list[Any]:
        """JSON bodies POSTed to `path`, in order."""
        return [b for m, p, b in self.requests if m == "POST" and p == path]

    def __enter__(self) -> "Replay":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
