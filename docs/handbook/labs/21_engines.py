"""Lab 21 — the engines compared: one interface over every engine, and the metrics it measures.

Smallest working piece: the harness's `Engine` protocol (`adapters/base.py`). `start()` returns what the
engine says about itself (`EngineInfo`), `generate()` streams `TokenEvent`s stamped on arrival. Every
engine — vLLM, SGLang, TensorRT-LLM, TGI, ours — is driven through exactly this, so TTFT and TPOT are
computed the same way for all of them. Here: the reference engine's in-process adapter, one request.

    python docs/handbook/labs/21_engines.py [--model DIR]
"""
import argparse
import asyncio
import time

from adapters import registry
from adapters.base import GenerationRequest, SamplingConfig
from reference_engine.engine.trace import resolve_model
from reference_engine.tokenizer.tokenizer import Tokenizer

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
args = ap.parse_args()
model = resolve_model(args.model)


async def main():
    engine = registry.create("reference", model, "float32", {"mode": "in_process", "kv_cache_tokens": 1024})
    info = await engine.start()
    print(f"EngineInfo: engine={info.engine} version={info.version} dtype={info.dtype} "
          f"KV capacity={info.kv_capacity_tokens} tokens, block size {info.block_size}")
    ids = Tokenizer(model).encode("The same prompt ids go to every engine")
    req = GenerationRequest("r0", ids, SamplingConfig(temperature=0.0, max_tokens=8, ignore_eos=True))
    sent = time.perf_counter_ns()
    events = []
    async for ev in engine.generate(req):
        events.append(ev)
        print(f"  +{(ev.recv_ns - sent) / 1e6:6.2f} ms  tokens {ev.token_ids}  finished={ev.finished}")
    await engine.stop()
    first = next(e for e in events if e.token_ids)
    out = sum(len(e.token_ids) for e in events)
    ttft = (first.recv_ns - sent) / 1e6
    e2e = (events[-1].recv_ns - sent) / 1e6
    print(f"TTFT {ttft:.2f} ms; TPOT (E2E - TTFT) / (tokens - 1) = ({e2e:.2f} - {ttft:.2f}) / {out - 1} "
          f"= {(e2e - ttft) / (out - 1):.2f} ms")


asyncio.run(main())
