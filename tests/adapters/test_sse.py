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
