"""Lab 05 — the attention kernel: online softmax, FlashAttention's tiling, and paged decode through a block table.

Smallest working piece: softmax over a row computed one tile at a time, keeping only a running max `m` and a
running sum `l` (online softmax). Attention built on it never holds a whole row of scores: each tile of keys
rescales what was summed so far by e^(m_old - m_new). That is FlashAttention's inner loop, and the loop of
the engine's C++ decode kernel (`kernels/ops.py`'s `decode`), which walks a request's KV blocks through its
block table in place. The lab checks each step in fp64 against the plain formula, then runs the C++ kernel
on one request and checks it against the PyTorch backend, then sizes the KV cache under GQA, MLA and a
sliding window from the models' own configuration classes.

    python docs/handbook/labs/05_attention.py [--model DIR]
"""
import argparse
import math

import torch
from transformers import DeepseekV3Config, LlamaConfig, MistralConfig

from reference_engine.attention import cpu_backend
from reference_engine.attention.torch_backend import TorchBackend
from reference_engine.config import ModelConfig
from reference_engine.kernels import ops
from reference_engine.worker.kv_cache import allocate_kv_cache
from reference_engine.worker.input_batch import make_batch
from reference_engine.engine.trace import resolve_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
args = ap.parse_args()
torch.manual_seed(0)
EPS64 = torch.finfo(torch.float64).eps


def agreement(what: str, diff: float, tol: float) -> str:
    """The lab's verdict on a comparison, from the measured difference and the tolerance it states."""
    return (f"{what}: agree to rounding (max |difference| {diff:.1e} <= {tol:.0e})" if diff <= tol else
            f"{what}: DISAGREE (max |difference| {diff:.1e} > {tol:.0e})")


# 1. Online softmax: one pass over tiles, a running max m and a running sum l of e^(x - m).
def online_softmax(x: torch.Tensor, tile: int = 4) -> torch.Tensor:
    m, l = -math.inf, 0.0
    for i in range(0, len(x), tile):
        t = x[i:i + tile]
        m_new = max(m, t.max().item())
        l = l * math.exp(m - m_new) + torch.exp(t - m_new).sum().item()  # rescale the old sum, add the tile's
        m = m_new
    return torch.exp(x - m) / l


x = torch.randn(37, dtype=torch.float64) * 4
diff = (online_softmax(x) - torch.softmax(x, 0)).abs().max().item()
print(agreement("online softmax over 10 tiles of 4 (37 scores, fp64) and torch.softmax", diff, 8 * EPS64)
      + f"; {diff / EPS64:.1f} x fp64 epsilon")


# 2. FlashAttention's tiling: the same recurrence carries the output: acc = acc * e^(m_old - m_new) + P_tile @ V_tile.
def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tile: int) -> tuple[torch.Tensor, int]:
    """One query row against n keys, tile by tile; returns the output and the most scores held at once."""
    m, l, acc = -math.inf, 0.0, torch.zeros_like(v[0])
    for i in range(0, len(k), tile):
        s = k[i:i + tile] @ q / math.sqrt(len(q))  # this tile's scores only
        m_new = max(m, s.max().item())
        c = math.exp(m - m_new)
        p = torch.exp(s - m_new)
        l, acc, m = l * c + p.sum().item(), acc * c + p @ v[i:i + tile], m_new
    return acc / l, min(tile, len(k))


n, d = 1000, 64
q, k, v = torch.randn(d, dtype=torch.float64), torch.randn(n, d, dtype=torch.float64), torch.randn(n, d, dtype=torch.float64)
exact = torch.softmax(k @ q / math.sqrt(d), 0) @ v
tiled, held = tiled_attention(q, k, v, tile=128)
print(agreement(f"tiled attention (one query, {n} keys, tiles of 128) and softmax(q K^T / sqrt(d)) V in fp64",
                (tiled - exact).abs().max().item(), 8 * EPS64) + f"; scores held at once: {held} of {n}")

# 3. Paged decode: the engine's C++ kernel reads one request's keys and values in place through its block table.
mc = ModelConfig.from_dir(resolve_model(args.model))
BS, table, ctx = 4, [5, 2, 7], 11  # 10 cached tokens + the one decoding now, in blocks 5, 2, 7 of an 8-block pool
G = mc.num_heads // mc.num_kv_heads
print(f"model: {mc.num_heads} query heads, {mc.num_kv_heads} KV heads of {mc.head_dim} (GQA: each KV head serves "
      f"{G} query heads: query heads {', '.join(f'{h * G}-{h * G + G - 1} read KV head {h}' for h in range(mc.num_kv_heads))})")
print(f"block table {table}, block size {BS}: " + "; ".join(
    f"tokens {b * BS}-{min(ctx, (b + 1) * BS) - 1} in block {blk}" for b, blk in enumerate(table)))
caches = {name: allocate_kv_cache(mc, 8, BS, torch.float32, "cpu") for name in ("cpu", "torch")}
prompt = make_batch([(list(range(ctx - 1)), 0, table)], BS, "cpu")  # writes the 10 cached tokens' K and V
step = make_batch([([7], ctx - 1, table)], BS, "cpu")  # the decode: one query at position 10
kc, vc = torch.randn(ctx - 1, mc.num_kv_heads, mc.head_dim), torch.randn(ctx - 1, mc.num_kv_heads, mc.head_dim)
qd = torch.randn(1, mc.num_heads, mc.head_dim)
kd, vd = torch.randn(1, mc.num_kv_heads, mc.head_dim), torch.randn(1, mc.num_kv_heads, mc.head_dim)
scale = mc.head_dim ** -0.5
for name, cache in caches.items():
    k_cache, v_cache = cache[0]
    k_cache.view(-1, mc.num_kv_heads, mc.head_dim).index_copy_(0, prompt.meta.slot_mapping, kc)
    v_cache.view(-1, mc.num_kv_heads, mc.head_dim).index_copy_(0, prompt.meta.slot_mapping, vc)
print(f"decode step: slot mapping {step.meta.slot_mapping.tolist()} (block {table[(ctx - 1) // BS]}, offset "
      f"{(ctx - 1) % BS}), context length {step.meta.seq_lens.tolist()[0]}, num_decodes {step.meta.num_decodes}")
ref = TorchBackend(caches["torch"], BS).forward(0, qd, kd, vd, step.meta, scale)
# by hand, in fp64: gather the table's blocks, each query head reads its group's KV head
keys = torch.cat([kc, kd]).double()
vals = torch.cat([vc, vd]).double()
heads = torch.arange(mc.num_heads) // G
scores = torch.einsum("hd,thd->ht", qd[0].double(), keys[:, heads]) * scale
by_hand = torch.einsum("ht,thd->hd", torch.softmax(scores, -1), vals[:, heads])
FP32 = 1e-5  # float32 caches and scores: sums of 11 terms agree far inside this
print(agreement("PyTorch backend (fp32) and the gathered blocks by hand (fp64)", (ref[0].double() - by_hand).abs().max().item(), FP32))
if ops.available():
    out = cpu_backend.CpuBackend(caches["cpu"], BS).forward(0, qd, kd, vd, step.meta, scale)
    same_kv = torch.equal(caches["cpu"][0][0], caches["torch"][0][0]) and torch.equal(caches["cpu"][0][1], caches["torch"][0][1])
    print(agreement(f"C++ decode kernel and PyTorch backend ({out.numel()} outputs)", (out - ref).abs().max().item(), FP32)
          + f"; the KV caches they wrote are {'identical' if same_kv else 'DIFFERENT'}")
else:
    print("C++ decode kernel: not available here (no C++ compiler with OpenMP); the PyTorch backend ran alone")


# 4. KV bytes per token under GQA, MLA and a sliding window, from the configuration classes' defaults.
def kv_bytes(layers: int, kv_heads: int, k_dim: int, v_dim: int, dtype_bytes: int = 2) -> int:
    return layers * kv_heads * (k_dim + v_dim) * dtype_bytes


llama = LlamaConfig(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096)  # 3.1-8B
gqa = kv_bytes(32, llama.num_key_value_heads, 128, 128)
mha = kv_bytes(32, llama.num_attention_heads, 128, 128)
print(f"Llama-3.1-8B, bf16: GQA with 8 KV heads {gqa:,} B/token; with a KV head per query head (MHA) it would be "
      f"{mha:,} ({mha // gqa}x)")
ds = DeepseekV3Config()
mla = ds.num_hidden_layers * (ds.kv_lora_rank + ds.qk_rope_head_dim) * 2  # one latent + one RoPE key per token and layer
ds_mha = kv_bytes(ds.num_hidden_layers, ds.num_attention_heads, ds.qk_nope_head_dim + ds.qk_rope_head_dim, ds.v_head_dim)
print(f"DeepSeek-V3 (transformers' DeepseekV3Config defaults: {ds.num_hidden_layers} layers, {ds.num_attention_heads} "
      f"heads), bf16: MLA caches {ds.kv_lora_rank} + {ds.qk_rope_head_dim} = {ds.kv_lora_rank + ds.qk_rope_head_dim} "
      f"values per token and layer, {mla:,} B/token; the same heads as MHA would cache {ds_mha:,} ({ds_mha / mla:.0f}x)")
mi = MistralConfig()
per_tok = kv_bytes(mi.num_hidden_layers, mi.num_key_value_heads, mi.head_dim, mi.head_dim)
long_ctx, vblock = 32768, 16
print(f"Mistral-7B (MistralConfig defaults: sliding window {mi.sliding_window:,}), bf16, {per_tok:,} B/token: a "
      f"{long_ctx:,}-token context holds {per_tok * long_ctx / 2**30:.2f} GiB with full attention, "
      f"{per_tok * mi.sliding_window / 2**30:.2f} GiB within the window; a prefix-cache hit needs only the "
      f"ceil(({mi.sliding_window} - 1) / {vblock}) = {-(-(mi.sliding_window - 1) // vblock)} blocks of {vblock} before "
      f"it, not all {long_ctx // vblock}")
