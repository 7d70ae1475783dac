"""Bare streaming clients against one OpenAI-compatible server: how far above the server's own
TTFT histogram (vLLM names) does each read the first token? httpx vs aiohttp, with and without
`return_token_ids`; 48 random prompts of 256 ids -> 64 tokens at concurrency 4, two rounds.

    .venv/bin/python scripts/stream_client_probe.py http://127.0.0.1:PORT MODEL_NAME

(docs/perf/2026-11-30-observer.md, section 2)
"""
import asyncio
import random
import re
import sys
import time
import urllib.request

import aiohttp
import httpx

URL = sys.argv[1]; MODEL = sys.argv[2]
N, IN, OUT, CONC = 48, 256, 64, 4

def scrape():
    t = urllib.request.urlopen(URL + "/metrics").read().decode()
    def g(name):
        s = re.search(rf"^{name}_sum\{{[^}}]*\}} ([0-9.e+-]+)", t, re.M); c = re.search(rf"^{name}_count\{{[^}}]*\}} ([0-9.e+-]+)", t, re.M)
        return float(s.group(1)), float(c.group(1))
    return g("vllm:time_to_first_token_seconds")

def body(ids, rti):
    b = {"model": MODEL, "prompt": ids, "max_tokens": OUT, "temperature": 0.0, "top_p": 1.0, "stream": True,
         "stream_options": {"include_usage": True}, "ignore_eos": True}
    if rti: b["return_token_ids"] = True
    return b

async def run_httpx(prompts, rti):
    ttfts = []
    async with httpx.AsyncClient(base_url=URL, timeout=None, limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)) as c:
        q = list(prompts)
        async def w():
            while q:
                ids = q.pop()
                t0 = time.perf_counter_ns(); first = None
                async with c.stream("POST", "/v1/completions", json=body(ids, rti)) as r:
                    async for line in r.aiter_lines():
                        if first is None and line.startswith("data:") and '"text"' in line:
                            first = time.perf_counter_ns()
                ttfts.append((first - t0) / 1e6)
        await asyncio.gather(*(w() for _ in range(CONC)))
    return ttfts

async def run_aiohttp(prompts, rti):
    ttfts = []
    async with aiohttp.ClientSession(URL, timeout=aiohttp.ClientTimeout(total=None)) as s:
        q = list(prompts)
        async def w():
            while q:
                ids = q.pop()
                t0 = time.perf_counter_ns(); first = None
                async with s.post("/v1/completions", json=body(ids, rti)) as r:
                    async for raw in r.content:
                        line = raw.decode()
                        if first is None and line.startswith("data:") and '"text"' in line:
                            first = time.perf_counter_ns()
                ttfts.append((first - t0) / 1e6)
        await asyncio.gather(*(w() for _ in range(CONC)))
    return ttfts

async def main():
    rng = random.Random(0)
    for rnd in range(2):
        for name, fn, rti in (("httpx+rti", run_httpx, True), ("aiohttp+rti", run_aiohttp, True),
                              ("aiohttp", run_aiohttp, False), ("httpx", run_httpx, False)):
            prompts = [[rng.randrange(10, 1000) for _ in range(IN)] for _ in range(N)]
            s0, c0 = scrape(); t = await fn(prompts, rti); s1, c1 = scrape()
            srv = (s1 - s0) / (c1 - c0) * 1e3
            cm = sum(t) / len(t)
            print(f"{rnd} {name:12s} client {cm:7.1f} server {srv:7.1f} diff {cm - srv:+6.1f} n={c1-c0:.0f}", flush=True)

asyncio.run(main())
