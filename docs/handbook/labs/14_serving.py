"""Lab 14 — the serving engine: one async step loop, many streams, bounded admission, metrics.

Smallest working piece: `AsyncEngine` runs `LLMEngine.step` in an engine thread of its own, for asyncio;
each request gets a stream of deltas. Three clients stream at once and their deltas interleave step by
step; then the server's admission gate refuses work beyond its limit (503 + Retry-After) instead of
letting the queue grow; then the Prometheus text a scraper would read.

    python docs/handbook/labs/14_serving.py [--model DIR]
"""
import argparse
import asyncio
import time

from reference_engine.engine.async_engine import AsyncEngine
from reference_engine.config import EngineConfig
from reference_engine.sampling_params import SamplingParams
from reference_engine.server.errors import APIError
from reference_engine.server.generation import Gate
from reference_engine.server.metrics import ServerMetrics
from reference_engine.engine.trace import resolve_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
args = ap.parse_args()


async def client(engine, name, prompt, n, t0, log):
    ids = engine.tokenizer.encode(prompt)
    async for d in engine.generate(ids, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), name):
        log.append((time.perf_counter() - t0, name, d.new_token_ids, d.finished))


async def main():
    engine = await AsyncEngine(EngineConfig(model=resolve_model(args.model))).start()
    t0, log = time.perf_counter(), []
    await asyncio.gather(client(engine, "A", "Hello there", 4, t0, log),
                         client(engine, "B", "A longer prompt about caches and memory", 6, t0, log),
                         client(engine, "C", "Hi", 3, t0, log))
    for t, name, ids, fin in log:  # one delta per request per step: the streams advance together
        print(f"{t * 1e3:7.1f} ms  {name}: {ids}{'  finished' if fin else ''}")

    gate = Gate(limit=2)  # the server counts requests without a first token yet
    for i in range(3):
        try:
            gate.reserve(1)
            print(f"request {i}: admitted ({gate.pending} waiting)")
        except APIError as e:
            print(f"request {i}: refused with HTTP {e.status}: {e.message} (headers {e.headers})")

    text = ServerMetrics(engine, "tiny").render().decode()
    wanted = ("vllm:num_requests_running", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
              "vllm:kv_cache_usage_perc")
    print("\n".join(line for line in text.splitlines() if line.startswith(wanted)))
    await engine.shutdown()


asyncio.run(main())
