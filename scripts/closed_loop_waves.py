"""C closed-loop streams against a running OpenAI-compatible server, N requests each (128 random ids
-> 32 greedy tokens, ignore_eos): prints every wave's sends and TTFTs (ms after the first send : TTFT
ms) and the run's TTFT / TPOT p50 and output tok/s. A quick look at how a server batches a closed
loop's waves; numbers for users come from `inferlab run` (experiments/configs/cpu_vs_vllm.toml).

    .venv/bin/python scripts/closed_loop_waves.py PORT C N [SEED] [MODEL]
"""
import asyncio, random, sys, time
import httpx
port, C, N = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 0)  # vary it: repeated prompts hit the prefix cache
model = sys.argv[5] if len(sys.argv) > 5 else "models/smollm2-135m-instruct"
async def one(client, i):
    ids = [rng.randrange(100, 40000) for _ in range(128)]
    t0 = time.perf_counter(); first = None
    async with client.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json={"model": model, "prompt": ids, "max_tokens": 32, "temperature": 0, "ignore_eos": True, "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data:") and first is None and "text" in line:
                first = time.perf_counter()
    return t0, first - t0, time.perf_counter() - t0
async def stream(client, k, out):
    for j in range(N):
        out.append((k, j) + await one(client, k))
async def main():
    async with httpx.AsyncClient(timeout=120) as client:
        await one(client, 0)
        out = []; T = time.perf_counter()
        await asyncio.gather(*(stream(client, k, out) for k in range(C)))
        el = time.perf_counter() - T
    for j in range(N):
        w = sorted((o for o in out if o[1] == j), key=lambda o: o[2])
        print(f"wave {j}: " + " ".join(f"{(o[2]-T)*1e3:.0f}:{o[3]*1e3:.0f}" for o in w))
    ttfts = sorted(o[3] for o in out); tp = [(o[4]-o[3])/31 for o in out]
    print(f"TTFT p50 {ttfts[len(ttfts)//2]*1e3:.0f} mean {sum(ttfts)/len(ttfts)*1e3:.0f} ms, TPOT p50 {sorted(tp)[len(tp)//2]*1e3:.1f} ms, {C*N*32/el:.1f} out tok/s")
asyncio.run(main())
