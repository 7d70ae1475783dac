"""Lab 02 — prefill: one forward pass by hand, straight from the weights.

Smallest working piece: embedding lookup, then for each layer RMSNorm -> q/k/v -> RoPE -> causal
attention (grouped-query) -> o_proj -> residual -> SwiGLU MLP -> residual, then the LM head. We do
it with plain tensor ops on the safetensors file and compare with the engine's own model.

    python docs/handbook/labs/02_prefill.py [--model DIR] [--prompt "..."]
"""
import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from reference_engine.attention import TorchBackend
from reference_engine.config import ModelConfig
from reference_engine.worker.input_batch import make_batch
from reference_engine.worker.kv_cache import allocate_kv_cache
from reference_engine.model.loader import load_model
from reference_engine.tokenizer.tokenizer import Tokenizer
from reference_engine.engine.trace import resolve_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
ap.add_argument("--prompt", default="The cat sat on the mat because")
args = ap.parse_args()
model_dir = resolve_model(args.model)
cfg = json.loads((Path(model_dir) / "config.json").read_text())
W = load_file(str(Path(model_dir) / "model.safetensors"))  # name -> tensor, as in any HF checkpoint
ids = torch.tensor(Tokenizer(model_dir).encode(args.prompt))
N, H, Hkv = len(ids), cfg["num_attention_heads"], cfg["num_key_value_heads"]
D = cfg.get("head_dim") or cfg["hidden_size"] // H
print(f"prompt: {N} tokens; hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
      f"{H} query heads share {Hkv} KV heads of {D} dims")


def rms(x, w):  # normalise each row to unit RMS, then scale per channel
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]))


def rope(x, pos):  # rotate pairs (i, i + D/2) by an angle that grows with position
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, D, 2).float() / D)
    ang = torch.outer(pos.float(), inv)
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    rot = torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + rot * sin


pos = torch.arange(N)
x = W["model.embed_tokens.weight"][ids]  # (N, hidden): a row per token
print(f"embed          x {tuple(x.shape)}")
for i in range(cfg["num_hidden_layers"]):
    p = f"model.layers.{i}."
    h = rms(x, W[p + "input_layernorm.weight"])
    q = (h @ W[p + "self_attn.q_proj.weight"].T).view(N, H, D)
    k = (h @ W[p + "self_attn.k_proj.weight"].T).view(N, Hkv, D)  # these two are what the KV cache keeps
    v = (h @ W[p + "self_attn.v_proj.weight"].T).view(N, Hkv, D)
    q, k = rope(q, pos), rope(k, pos)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)  # GQA: share KV heads
    scores = torch.einsum("qhd,khd->hqk", q, k) / D ** 0.5  # (H, N, N)
    scores = scores.masked_fill(torch.triu(torch.ones(N, N, dtype=torch.bool), 1), float("-inf"))
    o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(N, H * D)
    x = x + o @ W[p + "self_attn.o_proj.weight"].T
    h = rms(x, W[p + "post_attention_layernorm.weight"])
    gate, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
    x = x + (torch.nn.functional.silu(gate) * up) @ W[p + "mlp.down_proj.weight"].T
    if i == 0:
        print(f"layer 0        q {tuple(q.shape)}  k,v {(N, Hkv, D)} (before GQA repeat)  "
              f"scores {tuple(scores.shape)}  mlp {tuple(gate.shape)}")
head = W.get("lm_head.weight", W["model.embed_tokens.weight"])  # tied embeddings reuse the table
logits = rms(x, W["model.norm.weight"])[-1] @ head.T  # only the last row predicts the next token
print(f"logits (last row) {tuple(logits.shape)}; next token id {int(logits.argmax())}")

# The engine's model on the same prompt: one prefill sequence, KV written into a paged cache.
mc = ModelConfig.from_dir(model_dir)
model, _ = load_model(model_dir, torch.float32, "cpu", 2048)
kv = allocate_kv_cache(mc, num_blocks=8, block_size=16, dtype=torch.float32, device="cpu")
batch = make_batch([(ids.tolist(), 0, list(range(8)))], 16, "cpu")
with torch.inference_mode():
    ref = model.logits(model(batch.input_ids, batch.positions, TorchBackend(kv, 16), batch.meta)[-1:])[0]
print(f"engine vs by-hand: max |logit diff| {float((ref - logits).abs().max()):.2e}; "
      f"same next token: {int(ref.argmax()) == int(logits.argmax())}")
flops = 2 * sum(t.numel() for n, t in W.items() if "layers" in n) * N
print(f"matmul FLOPs of the layers for this prefill ~ 2 x layer params x tokens = {flops:,}")
