"""GPU check for the in-process adapters: the reference engine and the HF baseline on CUDA.

    python scripts/gpu/adapters.py [--device cuda] [--dtype float32]

Makes a tiny model in a temp folder, streams the same greedy requests through
the reference engine (in_process, device=DEVICE) and `HFEngine` (device=DEVICE), and exits 1
unless every request gives identical tokens (float32) — in bf16/fp16 it only reports the
agreement, since near-ties may flip. Needs torch, transformers, tokenizers, safetensors,
httpx and psutil (all in the GPU image); runs in well under a minute once the model is made.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from adapters.base import GenerationRequest, SamplingConfig  # noqa: E402
from adapters.registry import create  # noqa: E402


async def stream_all(engine, prompts, max_tokens: int) -> tuple[list[list[int]], float]:
    async def one(i, p):
        out = []
        async for ev in engine.generate(GenerationRequest(f"r{i}", p, SamplingConfig(max_tokens=max_tokens))):
            out += ev.token_ids
        return out

    t0 = time.perf_counter()
    outs = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return list(outs), time.perf_counter() - t0


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    from reference_engine.model.make import make_model

    model = Path(tempfile.mkdtemp(prefix="inferlab-gpu-")) / "tiny-llama"
    make_model(model, preset="tiny", family="llama", seed=0)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 8192) for _ in range(rng.randrange(4, 64))] for _ in range(args.requests)]
    results = {}
    for name, opts in (("reference", {"device": args.device}), ("hf", {"device": args.device})):
        engine = create(name, str(model), args.dtype, opts)
        info = await engine.start()
        try:
            results[name], secs = await stream_all(engine, prompts, args.max_tokens)
        finally:
            await engine.stop()
        print(f"{name}: {info.version} device={info.knobs.get('device')} {secs:.2f} s for {len(prompts)} requests")
    agree = sum(a == b for a, b in zip(results["reference"], results["hf"]))
    print(f"greedy agreement hf vs reference ({args.dtype}, {args.device}): {agree}/{len(prompts)}")
    return 0 if agree == len(prompts) or args.dtype != "float32" else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
