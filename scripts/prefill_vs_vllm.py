"""Prefill alone, offline, the reference engine against vLLM-CPU: PROMPTS prompts of 128 random tokens
and one output token, 2 threads, medians of 10 calls after warm-up (docs/perf/2026-12-05-amx.md).

    .venv/bin/python scripts/prefill_vs_vllm.py reference DTYPE PROMPTS
    VLLM_CPU_OMP_THREADS_BIND=0-1 .venv-vllm/bin/python scripts/prefill_vs_vllm.py vllm DTYPE PROMPTS
"""
import os
import random
import statistics
import sys
import time

MODEL = "models/smollm2-135m-instruct"


def main():
    engine, dtype, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(5)
    prompts = lambda: [[rng.randrange(100, 40000) for _ in range(128)] for _ in range(n)]  # noqa: E731
    if engine == "vllm":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
        llm = LLM(MODEL, dtype=dtype, max_model_len=256, max_num_batched_tokens=2048)
        sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        run = lambda ps: llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], sp, use_tqdm=False)  # noqa: E731
    else:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from reference_engine import LLM, SamplingParams
        llm = LLM(MODEL, dtype=dtype, kv_cache_tokens=16384, max_model_len=256, num_threads=2)
        sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        run = lambda ps: llm.generate(ps, sp)  # noqa: E731
    ts = []
    for _ in range(12):
        ps = prompts()
        t = time.perf_counter()
        run(ps)
        ts.append(time.perf_counter() - t)
    ts = ts[2:]
    print(f"{engine} {dtype} {n} x 128 -> 1 token: min {min(ts) * 1e3:.1f} ms, median {statistics.median(ts) * 1e3:.1f} ms")


if __name__ == "__main__":  # vLLM starts its engine core in a spawned process
    main()
