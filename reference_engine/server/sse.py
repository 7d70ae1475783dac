"""Server-sent events, written by hand: `data: {json}\\n\\n` per event.

`SSEResponse` guarantees its `on_close` callback runs however the response ends (finished,
client gone, server cancelled, or never started), which is where the caller aborts engine
requests that are still running: a disconnect frees the request's KV blocks.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

DONE = "data: [DONE]\n\n"


def event(obj: Any) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


class SSEResponse(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]):
        # X-Accel-Buffering: proxies must not buffer a token stream (TGI sends the same header).
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()  # runs the generator's own finally, if it started
            finally:
                self._on_close()
