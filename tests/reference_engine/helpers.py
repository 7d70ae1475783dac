"""Helpers for the reference engine tests: seeded prompts and HF greedy references."""
from __future__ import annotations

import functools

import torch


def random_prompts(vocab: int, n: int, lo: int = 1, hi: int = 100, seed: int = 0) -> list[list[int]]:
    """`n` prompts of mixed lengths in [lo, hi), avoiding the first few (special) ids."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(8, vocab, (k,), generator=g).tolist() for k in lens]


@functools.lru_cache(maxsize=8)
def _hf_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """HF transformers `generate(do_sample=False)`, one prompt at a time (no padding effects), never stopping at EOS."""
    model = _hf_model(str(model_dir))
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            r = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                               min_new_tokens=0, do_sample=False, eos_token_id=None, pad_token_id=0)
            out.append(r[0, len(p):].tolist())
    return out
