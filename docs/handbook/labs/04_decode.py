"""Lab 04 — decode: one token per step, reusing the KV cache, and why that step is cheap in FLOPs
but not in bytes.

Smallest working piece: after a prefill, feed ONE token (shape (1,)) with its position; attention
reads the earlier keys/values from the cache instead of recomputing them. We check every cached step
against a full recompute of the whole sequence, and time both.

    python docs/handbook/labs/04_decode.py [--model DIR] [--steps N]
"""
import argparse
import statistics
import time

import torch

from reference_engine.attention import TorchBackend
from reference_engine.config import ModelConfig
from reference_engine.worker.input_batch import make_batch
from reference_engine.worker.kv_cache import allocate_kv_cache
from reference_engine.model.loader import load_model
from reference_engine.tokenizer.tokenizer import Tokenizer
from reference_engine.engine.trace import resolve_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
ap.add_argument("--steps", type=int, default=6)
args = ap.parse_args()
model_dir = resolve_model(args.model)
mc = ModelConfig.from_dir(model_dir)
model, _ = load_model(model_dir, torch.float32, "cpu", 2048)
BS, table = 16, list(range(16))  # one sequence owning blocks 0..15 (256 token slots)
kv = allocate_kv_cache(mc, 16, BS, torch.float32, "cpu")
backend = TorchBackend(kv, BS)


@torch.inference_mode()
def forward(tokens, start, cache):
    """Run `tokens` whose first one sits at position `start`; return the last row's next token."""
    b = make_batch([(tokens, start, table)], BS, "cpu")
    be = backend if cache else TorchBackend(allocate_kv_cache(mc, 16, BS, torch.float32, "cpu"), BS)
    return int(model.logits(model(b.input_ids, b.positions, be, b.meta)[-1:]).argmax()), b


seq = Tokenizer(model_dir).encode("Once upon a time, in a small village,")
tok, b = forward(seq, 0, cache=True)  # prefill: N = prompt length, KV for all of it written
print(f"prefill: input_ids {tuple(b.input_ids.shape)}, writes {len(seq)} KV slots")
seq.append(tok)
ratios = []  # recompute time / decode time, per step
for step in range(args.steps):
    t0 = time.perf_counter()
    tok, b = forward([seq[-1]], len(seq) - 1, cache=True)  # decode: ONE new token
    t_dec = time.perf_counter() - t0
    t0 = time.perf_counter()
    again, _ = forward(seq, 0, cache=False)  # no cache: recompute everything
    t_full = time.perf_counter() - t0
    assert tok == again, "cached decode disagrees with a full recompute"
    print(f"decode step {step}: input_ids {tuple(b.input_ids.shape)} at position {len(seq) - 1}, "
          f"context {int(b.meta.seq_lens[0])} -> token {tok}; {t_dec * 1e3:.1f} ms vs {t_full * 1e3:.1f} ms "
          f"recomputing all {len(seq)} tokens")
    ratios.append(t_full / t_dec)
    seq.append(tok)

# The conclusion from the timings: the median ratio, against the spread of the ratios (the noise).
def verdict(ratios: list[float], context: int) -> str:
    """recompute / decode time per step -> the lab's reading; inconclusive when the ratios straddle 1."""
    mid, lo, hi = statistics.median(ratios), min(ratios), max(ratios)
    if lo <= 1 <= hi or len(ratios) < 3:
        return (f"recompute / decode time ratio {mid:.2f} (range {lo:.2f}-{hi:.2f} over {len(ratios)} steps): "
                f"inconclusive on this machine at this context length; the tokens agree at every step")
    faster = "decode with the cache" if mid > 1 else "the full recompute"
    return (f"{faster} was faster at every step: recompute / decode = {mid:.2f}x median "
            f"(range {lo:.2f}-{hi:.2f}) at a context of ~{context} tokens; the tokens agree at every step")


print(verdict(ratios, len(seq)))

# Why a decode step leaves a GPU idle: per step every weight is read once for ONE token.
params = sum(p.numel() for n, p in model.named_parameters() if "layers" in n)
flops, bytes_ = 2 * params, 4 * params  # float32: 4 bytes per weight, 2 FLOPs (multiply + add) per weight
print(f"per decode token: {flops:,} FLOPs over {bytes_:,} weight bytes = {flops / bytes_:.2f} FLOP/byte; "
      f"a GPU needs ~200 FLOP/byte to be compute-bound (chapter 3)")
