"""CPU seconds per streamed event of `inferlab serve`'s HTTP process, its engine process and this client,
while N streams of TOK tokens each run on SmolLM2 (2 threads); extra args go to `inferlab serve`.

    .venv/bin/python scripts/serve_cpu_per_event.py PORT N TOK [--no-engine-process]
"""
import asyncio, json, os, random, subprocess, sys, time
import aiohttp, psutil
PORT = int(sys.argv[1]); N = int(sys.argv[2]); TOK = int(sys.argv[3]); extra = sys.argv[4:]
srv = subprocess.Popen([".venv/bin/inferlab", "serve", "models/smollm2-135m-instruct", "--port", str(PORT),
                        "--num-threads", "2", "--max-num-seqs", "128", "--kv-cache-tokens", "16384", "--log-level", "warning", *extra])
async def wait_up():
    async with aiohttp.ClientSession() as s:
        for _ in range(600):
            try:
                async with s.get(f"http://127.0.0.1:{PORT}/health") as r:
                    if r.status == 200: return
            except Exception: pass
            await asyncio.sleep(0.5)
async def one(s, ids):
    body = {"model": "models/smollm2-135m-instruct", "prompt": ids, "max_tokens": TOK, "temperature": 0, "ignore_eos": True, "stream": True}
    n = 0
    async with s.post(f"http://127.0.0.1:{PORT}/v1/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"): n += 1
    return n
def cpu(p):
    t = p.cpu_times(); return t.user + t.system
async def main():
    await wait_up()
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 49152) for _ in range(64)] for _ in range(N)]
    fe = psutil.Process(srv.pid); kids = fe.children(recursive=True)
    me = psutil.Process()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(one(s, p) for p in prompts[:4]))  # warm
        c0 = (cpu(fe), sum(cpu(k) for k in kids), cpu(me)); t = time.perf_counter()
        ev = sum(await asyncio.gather(*(one(s, p) for p in prompts)))
        wall = time.perf_counter() - t
        c1 = (cpu(fe), sum(cpu(k) for k in kids), cpu(me))
    d = [b - a for a, b in zip(c0, c1)]
    print(f"{' '.join(extra) or 'default'}: {N} streams x {TOK}: {ev} events, wall {wall:.2f} s ({N*TOK/wall:.0f} tok/s); "
          f"CPU s: front end {d[0]:.2f} ({d[0]/ev*1e6:.0f} us/event), engine {d[1]:.2f}, client {d[2]:.2f} ({d[2]/ev*1e6:.0f} us/event)")
try:
    asyncio.run(main())
finally:
    srv.terminate(); srv.wait(30)
