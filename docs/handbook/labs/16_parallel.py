"""Lab 16 — tensor parallelism on this CPU, and the arithmetic of every way to split a model.

Smallest working piece: one decoder layer's MLP split Megatron-style over 2 ranks: each rank holds half of
the gate/up rows (column-parallel) and the matching half of down's columns (row-parallel), computes a
partial output, and the sum of the partials, one all-reduce, is the layer's output. The lab checks that
on the real model's layer 0, then times a bare all-reduce between two gloo ranks, then runs the reference
engine at tensor_parallel_size=2 on SmolLM2-135M-Instruct and sets the all-reduce share of a decode step
it measured against the estimate 2 (N - 1) / N x bytes / bandwidth, and says from the numbers why they
differ. Last, the same arithmetic for Llama-3.1-8B on 8 GPUs over NVLink, and for pipeline, data and
expert parallelism.

    python docs/handbook/labs/16_parallel.py [--model DIR] [--tokens 8]
"""
import argparse
import datetime
import statistics
import threading
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors import safe_open
from transformers import DeepseekV3Config

from reference_engine.config import EngineConfig, ModelConfig
from reference_engine.distributed.sharding import ShardPlan
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.engine.trace import resolve_real_model
from reference_engine.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/smollm2-135m-instruct, made if absent)")
ap.add_argument("--tokens", type=int, default=8, help="tokens each of the 2 requests decodes at TP=2")
args = ap.parse_args()
model = resolve_real_model(args.model)
mc = ModelConfig.from_dir(model)
N = 2

# 1. Who holds what: heads follow their KV groups; the MLP's intermediate columns split in halves.
plans = [ShardPlan(mc, r, N) for r in range(N)]
for p in plans:
    s = p.shapes()
    print(f"rank {p.rank}: query heads {p.q0}-{p.q1 - 1} ({p.num_heads}), KV heads {p.kv0}-{p.kv1 - 1} ({p.num_kv_heads}), "
          f"MLP columns {p.i0}-{p.i1 - 1}; per layer qkv_proj {s['qkv_proj']}, o_proj {s['o_proj']}, "
          f"gate_up_proj {s['gate_up_proj']}, down_proj {s['down_proj']}")

# The MLP of layer 0, whole and as the sum of the two ranks' partial outputs (what the all-reduce adds).
name = "model.layers.0.mlp.{}_proj.weight"
with safe_open(f"{model}/model.safetensors", "pt") as f:
    w = {k: f.get_tensor(name.format(k)) for k in ("gate", "up", "down")}
x = torch.randn(4, mc.hidden_size, generator=torch.Generator().manual_seed(0))
full = F.linear(F.silu(F.linear(x, w["gate"])) * F.linear(x, w["up"]), w["down"])
partials = []
for p in plans:
    rows = lambda k: w[k][slice(*p.spec(name.format(k))[1:])]  # noqa: E731  (dim 0: this rank's rows)
    _, a, b = p.spec(name.format("down"))  # dim 1: the matching input columns of down
    partials.append(F.linear(F.silu(F.linear(x, rows("gate"))) * F.linear(x, rows("up")), w["down"][:, a:b]))
diff = (sum(partials) - full).abs().max().item()
print(f"layer 0 MLP on 4 tokens: whole vs rank 0 + rank 1 partial outputs: max |difference| {diff:.1e} "
      f"({'the same to fp32 rounding' if diff < 1e-4 * full.abs().max().item() else 'DIFFERENT'}); each partial is "
      f"{tuple(partials[0].shape)}, {partials[0].numel() * 4:,} B: what each rank all-reduces")


# 2. A bare all-reduce between two gloo ranks (two threads of this process, loopback TCP, as the engine's ranks).
def bare_allreduce(sizes: list[int], reps: int = 30) -> dict[int, float]:
    """bytes -> median seconds of one all-reduce of that many bytes between 2 ranks, nothing else running."""
    store, out = dist.HashStore(), {}

    def rank(r: int) -> None:
        pg = dist.ProcessGroupGloo(store, r, 2, datetime.timedelta(seconds=60))
        for n in sizes:
            t = torch.ones(n // 4)
            for _ in range(3):
                pg.allreduce([t]).wait()
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                pg.allreduce([t]).wait()
                ts.append(time.perf_counter() - t0)
            if r == 0:
                out[n] = statistics.median(ts)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out


def copy_gbps(repeats: int = 5) -> float:
    src = torch.ones(16 * 2**20)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return 2 * src.numel() * 4 / best / 1e9  # read + write, as experiments/measuring/bandwidth.py counts


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def ring_estimate(nbytes: float, n: int, gbps: float) -> float:
    """Seconds a ring all-reduce of nbytes over n ranks needs for its bytes alone: each rank sends and receives
    2 (n - 1) / n x nbytes through its link."""
    return 2 * (n - 1) / n * nbytes / (gbps * 1e9)


msg = 2 * mc.hidden_size * 4  # one all-reduce of a decode step of 2 sequences: (2, hidden) float32
bw = copy_gbps()
bare = bare_allreduce([msg, 64 * msg, 1024 * msg])
print(f"bare all-reduce, 2 gloo ranks, median of 30: " + "; ".join(
    f"{n:,} B {t * 1e6:.0f} us (bytes alone at the copy bandwidth {bw:.1f} GB/s: "
    f"{ring_estimate(n, N, bw) * 1e6:.2f} us)" for n, t in bare.items()))


# 3. The engine at tensor_parallel_size=2 on the real model: its own count of the decode steps' all-reduces.
def explain(share: float, estimate: float, per_call: float, bare_call: float) -> str:
    """Why the measured all-reduce share differs from the bytes estimate, from the numbers alone."""
    if share <= 2 * estimate:
        return "the bytes explain the all-reduce time"
    said = (f"measured {share:.0%} against {estimate:.2%} estimated ({share / max(estimate, 1e-12):.0f}x): not bytes. "
            f"A bare all-reduce of the same message took {bare_call * 1e6:.0f} us, {bare_call / per_call:.0%} of the "
            f"{per_call * 1e6:.0f} us one takes inside the engine: ")
    if bare_call >= 0.5 * per_call:
        return said + "per-message latency (two processes meeting over loopback TCP) is most of it"
    return said + (f"the other {(per_call - bare_call) * 1e6:.0f} us of each call is rank 0 waiting for rank 1's "
                   f"partial sum (the ranks reach the all-reduce at different times), not moving bytes")


eng = LLMEngine(EngineConfig(model=model, tensor_parallel_size=N, kv_cache_tokens=2048, record_steps=True))
try:
    for i in range(2):
        eng.add_request([100 + 7 * i + j for j in range(32)], SamplingParams(max_tokens=args.tokens, temperature=0.0,
                                                                             ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    st = eng.stats()
    calls = [c for r in eng.step_records if r.num_prefill_tokens == 0 for c in r.allreduces]
finally:
    eng.close()
step_s, ar_s = st.tp_decode_seconds / st.tp_decode_steps, st.tp_decode_allreduce_seconds / st.tp_decode_steps
step_bytes = st.tp_decode_allreduce_bytes / st.tp_decode_steps
per_call = statistics.median(c["ms"] for c in calls) / 1e3
est = ring_estimate(step_bytes, N, bw)
print(f"engine, TP={N}, 2 sequences decoding: {st.tp_decode_steps} decode steps of {step_s * 1e3:.1f} ms; per step "
      f"{len(calls) // st.tp_decode_steps} all-reduces ({2 * mc.num_layers} = 2 per layer) of {calls[0]['bytes']:,} B, "
      f"{step_bytes:,.0f} B in all, taking {ar_s * 1e3:.1f} ms = {ar_s / step_s:.0%} of the step (measured); "
      f"estimate 2(N-1)/N x bytes / copy bandwidth = {est * 1e3:.4f} ms = {est / step_s:.2%}")
print(explain(ar_s / step_s, est / step_s, per_call, bare[msg]))

# 4. The same arithmetic at scale (bf16; NVLink on an H200: 900 GB/s both directions together, 450 each way).
NV, HBM = 450e9, 4.8e12
h, layers, weights = 4096, 32, 8.03e9 - 128256 * 4096  # Llama-3.1-8B: hidden, layers, matmul weights
for batch in (1, 64):
    m = batch * h * 2  # one all-reduce: (batch, hidden) in bf16
    t_ar = ring_estimate(m, 8, NV / 1e9)
    read = weights * 2 / 8 / HBM  # each GPU reads its eighth of the weights
    print(f"Llama-3.1-8B, TP=8 over NVLink, batch {batch}: {2 * layers} all-reduces of {m:,} B per step, bytes alone "
          f"{t_ar * 1e6:.3f} us each, {2 * layers * t_ar * 1e3:.3f} ms per step, against {read * 1e3:.2f} ms to read "
          f"each GPU's 1/8 of the weights")
print(f"Llama-3.1-8B, PP=2: one send of {h * 2:,} B per token between the stages per step, no all-reduce; a token "
      f"still passes through all {layers} layers one stage after the other")
ds = DeepseekV3Config()
moe_layers = ds.num_hidden_layers - ds.first_k_dense_replace
k, groups, hid = ds.num_experts_per_tok, ds.topk_group, ds.hidden_size
# Group-limited routing: a token's k experts lie in at most topk_group of the n_group groups; at EP=8 with experts
# placed in order, group g is device g, so a token's hidden state is sent once to each of at most topk_group devices.
per_device = 2 * min(k, groups) * hid * 2  # dispatch + combine, bf16, once per device
per_expert = 2 * k * hid * 2  # the same counted once per expert (an overcount: several experts share a device)
print(f"DeepSeek-V3 (DeepseekV3Config defaults), EP=8: {ds.n_routed_experts} routed experts in {ds.n_group} groups, "
      f"top-{k} within at most {groups} groups, {moe_layers} MoE layers: each token's hidden state goes once to each of "
      f"at most {groups} devices and comes back once from each, at most {per_device:,} B per MoE layer, at most "
      f"{per_device * moe_layers / 1e6:.1f} MB per token (counted once per expert it would be {per_expert:,} B, "
      f"{per_expert * moe_layers / 1e6:.1f} MB)")


# 5. KV bytes per token on each rank: vLLM gives a rank max(1, KV heads // N) KV heads, and an MLA model's whole latent.
def kv_heads_per_rank(kv_heads: int, n: int, mla: bool = False) -> int:
    """vLLM's ModelConfig.get_num_kv_heads: 1 for MLA (every rank holds the latent), else max(1, kv_heads // n)."""
    return 1 if mla else max(1, kv_heads // n)


head = 2 * layers * 128 * 2  # Llama-3.1-8B: K and V of one KV head (128 dims), 32 layers, bf16
for n in (8, 16):
    h = kv_heads_per_rank(8, n)
    print(f"Llama-3.1-8B KV at TP={n}: {h} KV head per rank, {h * head:,} B per token on each rank "
          f"(8 KV heads split evenly would be {8 * head // n:,} B; each KV head is held by {max(1, n // 8)} "
          f"rank{'s' * (n > 8)})")
latent = (ds.kv_lora_rank + ds.qk_rope_head_dim) * ds.num_hidden_layers * 2
print(f"DeepSeek-V3 (MLA) KV at TP=8: {kv_heads_per_rank(1, 8, mla=True)} latent per rank, {latent:,} B per token on "
      f"every rank (split 8 ways it would be {latent // 8:,} B): TP does not shrink an MLA cache")
