"""Predictions at scales no machine here reaches, for `make simulate-bench`: the H200 spec profile
against TensorRT-LLM's published throughput table, and 10^5 requests through N replicas.

TensorRT-LLM's perf overview (docs/source/performance/perf-overview.md, Llama 3.1 8B, H200 TP1 FP8)
feeds `trtllm-bench throughput` every request at once (3000 requests at 128/2048 and at 1000/1000)
and reports total output tokens/s: 26,221 and 17,744 (a v1.0-era page, cited at a commit), and
25,399 and 17,538 in the page's v0.17 version (the release named in its text). The same scenario here: the simulated
replica with TensorRT-LLM's PyTorch-backend defaults (max batch 2048, 8192 tokens per step), FP8
weights and KV, the KV cache given 90 % of what the weights leave of 141 GB, every request arriving
at t = 0. The profile is the uncalibrated spec sheet: the ratio is reported, not tuned.
"""
from __future__ import annotations

import random
import time

from experiments.simulate import fleet
from reference_engine.engine import router
from experiments.simulate.replica import Replica
from experiments.simulate.step_model import ModelShape, Profile
from reference_engine import EngineConfig

LLAMA_31_8B_FP8 = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
                             vocab=128256, dtype="fp8", kv_dtype="fp8")
PUBLISHED = {(128, 2048): 26221.0, (1000, 1000): 17744.0}  # output tok/s, H200 TP1 FP8
SOURCE = ("NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md, stored version at commit 00f37686aa85 "
          "(its text introduces the v1.0 RTX 6000 tables), table 'Llama 3.1 8B', column H200 TP1 (FP8)")
# The same page at an earlier commit names its release in the text ("All data in the table below was
# generated using version 0.17"): the same shapes and 3000 requests, `trtllm-bench throughput` on a
# TensorRT engine, KV fraction 0.95. Its "Token Throughput" is output tokens/s (the page's own example:
# 3000 x 128 output tokens / 16.41 s = 23,406).
PUBLISHED_V017 = {(128, 2048): 25398.86, (1000, 1000): 17537.96}
SOURCE_V017 = ("NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md, stored version at commit 258c7540c035, "
               "whose text says the table was 'generated using version 0.17': 'LLaMA v3.1 8B', TP 1, "
               "H200 141GB HBM3, FP8")
REQUESTS = {(128, 2048): 3000, (1000, 1000): 3000}  # the doc's $num_requests for these shapes


def h200_replica(profile: Profile, shape: ModelShape = LLAMA_31_8B_FP8, max_num_seqs: int = 2048,
                 budget: int = 8192, kv_fraction: float = 0.9, seed: int = 0) -> Replica:
    free = profile.memory_gb * 1e9 - shape.weight_bytes - 2e9  # ~2 GB activations and workspace
    tokens = int(kv_fraction * free / shape.kv_bytes_per_token)
    cfg = EngineConfig(model="llama-3.1-8b-fp8 (shape only)", max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=budget, kv_cache_tokens=tokens, block_size=32)
    return Replica(cfg, tokens // 32, shape, profile, seed=seed)


def prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 128000) for _ in range(length)] for _ in range(n)]


def max_throughput(profile: Profile, isl: int, osl: int, n: int) -> dict:
    """Every request at t = 0 (trtllm-bench throughput); output tokens / (last token - 0)."""
    rep = h200_replica(profile)
    f = fleet.Fleet([rep], router.make("round_robin", 1))
    t0 = time.perf_counter()
    done, wall = f.run([fleet.Arrival(0.0, f"r{i}", p, osl) for i, p in enumerate(prompts(n, isl))])
    toks = sum(d.tokens for d in done)
    st = f.stats[0].summary(wall)
    return {"isl": isl, "osl": osl, "requests": n, "predicted_tok_s": toks / wall, "sim_seconds": wall,
            "published_tok_s": PUBLISHED.get((isl, osl)), "kv_tokens": rep.num_blocks * 32,
            "preemptions": st["preemptions"], "steps": st["steps"], "kv_peak": st["kv_peak"],
            "simulator_wall_s": time.perf_counter() - t0}


def table(profile: Profile) -> list[dict]:
    rows = []
    for (isl, osl), n in REQUESTS.items():
        r = max_throughput(profile, isl, osl, n)
        r["ratio"] = r["predicted_tok_s"] / r["published_tok_s"]
        r["published_v0_17_tok_s"] = PUBLISHED_V017[(isl, osl)]
        r["ratio_v0_17"] = r["predicted_tok_s"] / r["published_v0_17_tok_s"]
        rows.append(r)
    return rows


def at_scale(profile: Profile, n: int = 100_000, replicas: int = 8, rate: float = 400.0, isl: int = 512,
             osl: int = 128, names=("round_robin", "least_loaded", "prefix_aware")) -> list[dict]:
    """n Poisson arrivals at `rate` req/s over `replicas` H200s (chat-like, 512 in / 128 out, prompts drawn
    from 64 shared 256-token system prompts): each router's latency and the simulator's own wall time."""
    from experiments.running import load
    from experiments.simulate.capacity import latencies, stat

    rng = random.Random(1)
    heads = prompts(64, 256, seed=2)
    arr = [fleet.Arrival(t, f"r{i}", heads[rng.randrange(64)] + [rng.randrange(1, 128000) for _ in range(isl - 256)],
                         osl) for i, t in enumerate(load.arrivals(n, rate, 1.0, 0))]
    out = []
    for name in names:
        reps = [h200_replica(profile, seed=i) for i in range(replicas)]
        f = fleet.Fleet(reps, router.make(name, replicas, 32))
        t0 = time.perf_counter()
        done, wall = f.run(arr)
        lat = latencies(done)
        st = [s.summary(wall) for s in f.stats]
        out.append({"router": name, "requests": n, "replicas": replicas, "rate": rate,
                    "ttft_p50_ms": stat(lat["ttft"], "p50"), "ttft_p99_ms": stat(lat["ttft"], "p99"),
                    "tpot_p50_ms": stat(lat["tpot"], "p50"), "tpot_p99_ms": stat(lat["tpot"], "p99"),
                    "prefix_hit_rate": sum(s["prefix_hit_rate"] * s["requests"] for s in st) / n,
                    "kv_peak_max": max(s["kv_peak"] for s in st), "preemptions": sum(s["preemptions"] for s in st),
                    "busy_min": min(s["busy"] for s in st), "busy_max": max(s["busy"] for s in st),
                    "simulator_wall_s": time.perf_counter() - t0})
    return out
