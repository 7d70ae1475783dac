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


def hf_argmax_along(model_dir: str, prompts: list[list[int]], outputs: list[list[int]]) -> list[list[int]]:
    """HF transformers' greedy choice at every step of each output, teacher-forced: one forward pass
    over prompt + output[:-1], the argmax at the prompt's last position onward. It equals `outputs`
    exactly when HF's greedy decoding of the prompt gives `outputs` (by induction over the steps; a
    wrong token at step k shows at k, whatever follows it), with HF's full-sequence forward instead of
    its step-by-step one (the same function, rounded along another path). One forward per prompt
    instead of `generate`'s one per token: ~10x cheaper on the tiny models."""
    model = _hf_model(str(model_dir))
    out = []
    with torch.no_grad():
        for p, o in zip(prompts, outputs):
            ids = torch.tensor([list(p) + list(o)[:-1]])
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, len(p) - 1:]
            out.append(logits.argmax(-1).tolist())
    return out
