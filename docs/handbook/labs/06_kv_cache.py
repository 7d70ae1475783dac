"""Lab 06 — the KV cache: one KV write into a paged pool, and reading it back through a block table.

Smallest working piece: a pool of blocks per layer, shaped (num_blocks, block_size, kv_heads, head_dim);
a request's block table maps its token t to slot table[t // bs] * bs + t % bs; the attention backend
writes with one `index_copy_` and reads by gathering the table's blocks.

    python docs/handbook/labs/06_kv_cache.py [--model DIR]
"""
import argparse

import torch

from reference_engine.config import ModelConfig
from reference_engine.worker.input_batch import make_batch
from reference_engine.core.block_pool import blocks_needed
from reference_engine.worker.kv_cache import allocate_kv_cache
from reference_engine.engine.trace import resolve_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
args = ap.parse_args()
mc = ModelConfig.from_dir(resolve_model(args.model))
BS, NUM_BLOCKS = 4, 8
cache = allocate_kv_cache(mc, NUM_BLOCKS, BS, torch.float32, "cpu")  # per layer: (K, V)
k_cache, v_cache = cache[0]
print(f"{mc.num_layers} layers x (K, V), each {tuple(k_cache.shape)} = (blocks, block_size, kv_heads, head_dim)")

# A request of 10 tokens owns 3 blocks, in any order: the pool hands out whatever is free.
table = [5, 2, 7]
n = 10
assert blocks_needed(n, BS) == len(table)
batch = make_batch([(list(range(n)), 0, table)], BS, "cpu")
slots = batch.meta.slot_mapping
print(f"block table {table}; token t -> slot table[t // {BS}] * {BS} + t % {BS}: {slots.tolist()}")

# One KV write: this step's k, v (N, kv_heads, head_dim) go to their slots (what TorchBackend.forward does).
k = torch.randn(n, mc.num_kv_heads, mc.head_dim)
v = torch.randn(n, mc.num_kv_heads, mc.head_dim)
k_cache.view(-1, mc.num_kv_heads, mc.head_dim).index_copy_(0, slots, k)
v_cache.view(-1, mc.num_kv_heads, mc.head_dim).index_copy_(0, slots, v)
used = sorted({int(s) // BS for s in slots})
print(f"blocks written: {used}; untouched blocks stay zero: {bool(k_cache[[0, 1, 3, 4, 6]].eq(0).all())}")

# Read back in token order by gathering the table's blocks (what attention does for cached context).
k_read = k_cache[table].reshape(-1, mc.num_kv_heads, mc.head_dim)[:n]
assert torch.equal(k_read, k), "gathered keys differ from the written ones"
print(f"gather k_cache[{table}] -> {tuple(k_read.shape)}: identical to what was written")

# Decode appends one token: t = 10 goes to block table[2] = 7, offset 2; a 13th token needs a 4th block.
t = 10
print(f"token {t} -> block {table[t // BS]} offset {t % BS} (slot {table[t // BS] * BS + t % BS}); "
      f"token 12 needs block #{12 // BS + 1}: the manager appends one when the table runs out")

per_tok = mc.kv_bytes_per_token(torch.float32)
print(f"KV bytes/token here = 2 x {mc.num_layers} layers x {mc.num_kv_heads} heads x {mc.head_dim} x 4 B "
      f"= {per_tok:,} B")
llama8b = 2 * 32 * 8 * 128 * 2
print(f"Llama-3.1-8B in bf16: 2 x 32 x 8 x 128 x 2 B = {llama8b:,} B/token; "
      f"an 8k-token context = {llama8b * 8192 / 2**30:.2f} GiB")
