"""Time to first token of one 128-token prompt along the reference engine's paths, without HTTP:
the engine core in its own process (`ProcessAsyncEngine`, what `inferlab serve` runs; 50 ms idle
between requests), `LLM.generate` with max_tokens 1, and one `LLMEngine.step`. Set against a
served TTFT (`scripts/closed_loop_waves.py PORT 1 6 SEED`), it says how much the server adds.

    NT=2 .venv/bin/python scripts/ttft_paths.py float32|bfloat16      (NT: engine threads)

The process is started first, before this interpreter runs a threaded torch op, so it forks.
"""
import asyncio, os, random, statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_engine import LLM, EngineConfig, SamplingParams  # noqa: E402
from reference_engine.engine.engine_process import ProcessAsyncEngine  # noqa: E402
dt, nt = sys.argv[1], int(os.environ.get("NT", "2"))
kw = dict(dtype=dt, kv_cache_tokens=16384, max_model_len=256, num_threads=nt)
rng = random.Random(5)
P = lambda: [rng.randrange(100, 40000) for _ in range(128)]
sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
async def main():
    eng = await ProcessAsyncEngine(EngineConfig("models/smollm2-135m-instruct", **kw)).start()
    try:
        ts = []
        for i in range(9):
            t = time.perf_counter()
            async for d in eng.generate(P(), sp):
                ts.append(time.perf_counter() - t); break
            await asyncio.sleep(0.05)
        ts = ts[1:]
        print(f"{dt} ProcessAsyncEngine first delta: min {min(ts)*1e3:.1f} median {statistics.median(ts)*1e3:.1f} ms")
    finally:
        await eng.shutdown()


if __name__ == '__main__':
    asyncio.run(main())
    llm = LLM("models/smollm2-135m-instruct", **kw)
    llm.generate([P()], sp)
    ts = []
    for _ in range(8):
        p = P(); t = time.perf_counter(); llm.generate([p], sp); ts.append(time.perf_counter() - t)
    print(f"{dt} LLM.generate 128 -> 1 token: min {min(ts)*1e3:.1f} median {statistics.median(ts)*1e3:.1f} ms")
    e = llm.engine
    ts = []
    for _ in range(8):
        e.add_request(P(), sp); t = time.perf_counter(); e.step(); ts.append(time.perf_counter() - t)
        while e.has_unfinished(): e.step()
    print(f"{dt} one engine.step (prefill 128): min {min(ts)*1e3:.1f} median {statistics.median(ts)*1e3:.1f} ms")
