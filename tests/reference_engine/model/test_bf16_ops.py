"""What bfloat16 adds to a decode step, counted on CPU with torch.profiler (docs/engine.md, "bf16 on
CUDA"): exactly the casts HF's numerics need (RMSNorm in float32, once per norm; the RoPE table once
per forward, not per layer; logits to float32 once), nothing per layer besides. Too few launches to
make a bf16 step slower than fp32; the H200 slowdown was elsewhere (cuDNN attention plans)."""
from __future__ import annotations

import collections

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from reference_engine import LLM, SamplingParams
from reference_engine.attention import CUDA_SDPA
from tests.reference_engine.helpers import random_prompts


def decode_ops(model_dir, dtype: str) -> collections.Counter:
    # the plain PyTorch path (the one that mirrors HF's numerics); the CPU fast path's casts
    # (bf16 GEMMs in fp32 where the CPU has no bf16 math, packed_linear.py; fused kernels, fused_ops.py)
    # are by design
    llm = LLM(str(model_dir), dtype=dtype, kv_cache_tokens=2048, attention_backend="torch", linear_backend="torch",
              fused_ops=False)
    e = llm.engine
    for p in random_prompts(8192, 8, 10, 30):
        e.add_request(p, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    e.step()  # prefill
    e.step()  # first decode
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        e.step()  # a decode step of 8 sequences
    return collections.Counter((ev.name, str(ev.input_shapes[:1])) for ev in prof.events()
                               if ev.name == "aten::_to_copy")


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_bf16_adds_only_the_casts_hf_numerics_need(family, make_tiny):
    d = make_tiny(family)
    layers, hidden, heads, kv_heads, head_dim = 4, 256, 8, 2, 64 if family == "qwen3" else 32
    fp32, bf16 = decode_ops(d, "float32"), decode_ops(d, "bfloat16")
    extra = bf16 - fp32
    cast = "aten::_to_copy"
    expected = collections.Counter({
        (cast, f"[[8, {hidden}]]"): 2 * (2 * layers + 1),  # input/post-attention norms + final norm: in and out
        (cast, f"[[8, 1, {head_dim}]]"): 2,  # cos and sin, once per forward
        (cast, "[[8, 8192]]"): 1,  # logits to float32
    })
    if family == "qwen3":  # per-head q/k norms
        expected[(cast, f"[[8, {heads}, {head_dim}]]")] = 2 * layers
        expected[(cast, f"[[8, {kv_heads}, {head_dim}]]")] = 2 * layers
    assert extra == expected
    assert not (fp32 - bf16)


def test_torch_backend_keeps_cudnn_attention_off_cuda_steps():
    from torch.nn.attention import SDPBackend

    assert SDPBackend.CUDNN_ATTENTION not in CUDA_SDPA and SDPBackend.MATH in CUDA_SDPA
