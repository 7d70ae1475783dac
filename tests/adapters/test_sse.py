"""adapters.transport.sse against a real aiohttp server: the wire stamps of one streaming POST."""
from __future__ import annotations

import asyncio
import time

from aiohttp import web

from adapters.transport import sse
from adapters.transport.launcher import free_port

HOLD_S = 0.2  # the server reads the request, then holds its response headers this long


async def _serve(port: int) -> web.AppRunner:
    async def generate(req: web.Request) -> web.StreamResponse:
        await req.read()
        await asyncio.sleep(HOLD_S)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        for i in range(3):
            await resp.write(f"data: {i}\n\n".encode())
        return resp

    app = web.Application(client_max_size=1 << 24)
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def test_wire_stamps_the_request_leaving_and_the_headers_coming_back():
    port = free_port()
    runner = await _serve(port)
    streamer = await sse.Streamer(f"http://127.0.0.1:{port}").open()
    try:
        for ids in (1, 200_000):  # a small body and a 1.3 MB one (written in several chunks)
            send = time.perf_counter_ns()
            async with streamer.post("/generate", {"input_ids": list(range(ids))}) as resp:
                lines = [(t, line) async for t, line in resp.lines() if line]
            sent, headers = resp.wire
            assert send < sent < headers < lines[0][0]
            assert (headers - sent) / 1e9 >= HOLD_S  # the server's hold is on the far side of `sent`
            assert [line for _, line in lines] == ["data: 0", "data: 1", "data: 2"]
    finally:
        await streamer.aclose()
        await runner.cleanup()


async def test_a_pooled_connection_closed_under_the_request_is_retried_once_on_a_fresh_one():
    """The server answers the first request on a kept-alive connection, then closes that connection on the
    second request without answering (as llama.cpp's server does at its keep-alive limit): the request goes
    again on a new connection and succeeds. A server that never answers still fails it."""
    conns: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(len(conns))
        served = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            if served == 1 or len(conns) > 2:  # the pooled connection's second request: hang up
                writer.close()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 9\r\n"
                         b"Keep-Alive: timeout=5, max=100\r\n\r\ndata: 0\n\n")
            await writer.drain()
            served += 1

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    streamer = await sse.Streamer(f"http://127.0.0.1:{port}").open()
    try:
        for _ in range(2):
            async with streamer.post("/generate", {"x": 1}) as resp:
                assert [line async for _, line in resp.lines() if line] == ["data: 0"]
        assert len(conns) == 2  # the second request went again, on a second connection
        try:  # a third connection hangs up at once: the one retry fails too, and that is the error
            async with streamer.post("/generate", {"x": 1}) as resp:
                [line async for _, line in resp.lines()]
            raise AssertionError("a server that never answers must fail the request")
        except sse.StreamError:
            pass
    finally:
        await streamer.aclose()
        server.close()
