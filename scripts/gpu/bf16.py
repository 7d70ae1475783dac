"""Why bf16 decoded slower than fp32 on the H200 (docs/perf/2026-11-30-gpu-check-h200.md): a check of
the hypothesis, part of check.py.

Hypothesis: PyTorch's SDPA prefers cuDNN attention for fp16/bf16 on Hopper (it takes no fp32), and
cuDNN builds an execution plan for every new shape; in a decode step the key length is new every
step, in HF's `generate()` (its cache grows by one) as in the engine's old torch-backend decode. So
every bf16 decode step paid a plan build, fp32 never did, and both engines slowed alike.

Checked here: (1) which SDPA backend PyTorch picks for both decode calls, fp32 vs bf16; (2) the time
of 32 decode-shaped SDPA calls whose key length grows by one each (new shapes), then of the same 32
again (known shapes), with and without cuDNN; (3) the 2026-11-30 benchmark (`small` preset, 64
prompts x 128 tokens) through HF and the engine's torch backend with cuDNN allowed (as then) and
not (as now), and through the engine's default (Triton + CUDA graphs). Verdict printed either way.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import common
from common import Report, free_memory, hf_from_pretrained, hf_generate_tok_s, prompts_for, timed
from reference_engine import LLM, SamplingParams, attention
from reference_engine.attention import CUDA_SDPA
from reference_engine.model.make import make_model


def default_sdpa() -> list[SDPBackend]:
    """The SDPA backends this torch enables by default (what HF and the old engine ran with)."""
    b = torch.backends.cuda
    on = {SDPBackend.CUDNN_ATTENTION: b.cudnn_sdp_enabled(), SDPBackend.FLASH_ATTENTION: b.flash_sdp_enabled(),
          SDPBackend.EFFICIENT_ATTENTION: b.mem_efficient_sdp_enabled(), SDPBackend.MATH: b.math_sdp_enabled()}
    return [k for k, v in on.items() if v]


def _decode_call(dtype, ctx: int, masked: bool, b=64, h=12, hkv=4, d=64):
    """Tensors of one decode-step attention of the `small` preset: HF's (no mask) or the engine's (a mask)."""
    q = torch.randn(b, h, 1, d, device=common.DEVICE, dtype=dtype)
    k = torch.randn(b, hkv, ctx, d, device=common.DEVICE, dtype=dtype)
    v = torch.randn_like(k)
    mask = torch.ones(b, 1, 1, ctx, dtype=torch.bool, device=common.DEVICE) if masked else None
    return q, k, v, mask


def sdpa_choice(rep: Report) -> dict[str, str]:
    rows, picked = [], {}
    for dtype in (torch.float32, torch.bfloat16):
        for who, masked in (("HF generate (no mask)", False), ("engine torch backend (mask)", True)):
            q, k, v, mask = _decode_call(dtype, 300, masked)
            try:  # torch's own defaults, no context manager
                name = SDPBackend(torch._fused_sdp_choice(q, k, v, mask, 0.0, False, enable_gqa=True)).name
            except Exception as e:  # a private helper: report, do not fail the run
                name = f"unknown ({type(e).__name__})"
            picked[f"{who} {dtype}"] = name
            rows.append([who, str(dtype)[6:], name])
    rep.add(f"torch {torch.__version__}, cuDNN SDPA enabled by default: {torch.backends.cuda.cudnn_sdp_enabled()}. "
            "SDPA backend PyTorch picks for a decode step (64 sequences, 12 heads, 4 kv heads, 300 keys):", "")
    rep.table(["call", "dtype", "backend"], rows)
    return picked


def sdpa_timing(rep: Report) -> dict[str, float]:
    out, rows = {}, []
    for label, backends in (("default (cuDNN allowed)", default_sdpa()), ("without cuDNN", CUDA_SDPA)):
        calls = [_decode_call(torch.bfloat16, 129 + i, masked=False) for i in range(32)]
        with sdpa_kernel(backends):
            first = timed(lambda: [F.scaled_dot_product_attention(q, k, v, enable_gqa=True) for q, k, v, _ in calls])
            again = timed(lambda: [F.scaled_dot_product_attention(q, k, v, enable_gqa=True) for q, k, v, _ in calls])
        out[label] = first / 32
        rows.append([label, f"{first / 32 * 1e3:.3f}", f"{again / 32 * 1e3:.3f}"])
    rep.add("bf16 decode-shaped SDPA, 32 calls with 129..160 keys (each a new shape), ms per call:", "")
    rep.table(["SDPA", "new shapes", "same shapes again"], rows)
    return out


def old_benchmark(rep: Report, root) -> dict[str, float]:
    d = make_model(root / "small", preset="tiny" if common.SMOKE else "small", family="llama", seed=0)
    batch, out_len = (4, 8) if common.SMOKE else (64, 128)
    prompts = prompts_for(8192 if common.SMOKE else 32768, batch, 128, 129, seed=1)
    params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
    res, rows = {}, []
    for dtype, tdtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        for label, kw, cudnn in (
                ("engine, torch backend, eager, cuDNN SDPA allowed (as on 2026-11-30)",
                 dict(attention_backend="torch", enforce_eager=True), True),
                ("engine, torch backend, eager, no cuDNN SDPA (now)", dict(attention_backend="torch",
                                                                          enforce_eager=True), False),
                ("engine default: Triton + CUDA graphs", {}, False)):
            llm = LLM(str(d), device=common.DEVICE, dtype=dtype, max_num_seqs=batch, max_num_batched_tokens=8192,
                      kv_cache_tokens=batch * 320, **kw)
            old = attention.CUDA_SDPA
            attention.CUDA_SDPA = default_sdpa() if cudnn else CUDA_SDPA  # _sdpa reads the module global
            try:
                llm.generate(prompts[:4], dataclasses.replace(params, max_tokens=4))  # warm-up
                dt = timed(lambda: llm.generate(prompts, params))
            finally:
                attention.CUDA_SDPA = old
            res[f"{label} {dtype}"] = batch * out_len / dt
            rows.append([label, dtype, f"{batch * out_len / dt:,.0f}"])
            del llm
            free_memory()
        model = hf_from_pretrained(d, tdtype)
        for label, cudnn in (("HF generate, default SDPA", True), ("HF generate, no cuDNN SDPA", False)):
            tok_s = hf_generate_tok_s(model, prompts, out_len, cudnn=cudnn)
            res[f"{label} {dtype}"] = tok_s
            rows.append([label, dtype, f"{tok_s:,.0f}"])
        del model
        free_memory()
    rep.add(f"The 2026-11-30 benchmark again: `small` preset (~100 M), {batch} prompts x 128 tokens, {out_len} out, "
            "greedy; output tokens/s:", "")
    rep.table(["engine", "dtype", "output tok/s"], rows)
    return res


def check_bf16(rep: Report, root) -> None:
    rep.section("bf16 slower than fp32 on the H200: the cuDNN-attention hypothesis")
    picked = sdpa_choice(rep)
    per_call = sdpa_timing(rep)
    tok = old_benchmark(rep, root)
    hf_gain = tok["HF generate, no cuDNN SDPA bfloat16"] / tok["HF generate, default SDPA bfloat16"]
    eng_gain = (tok["engine, torch backend, eager, no cuDNN SDPA (now) bfloat16"]
                / tok["engine, torch backend, eager, cuDNN SDPA allowed (as on 2026-11-30) bfloat16"])
    confirmed = ("CUDNN" in picked.get("HF generate (no mask) torch.bfloat16", "")
                 and per_call["default (cuDNN allowed)"] > 3 * per_call["without cuDNN"]
                 and hf_gain > 2 and eng_gain > 2)
    rep.add(f"Verdict: hypothesis {'CONFIRMED' if confirmed else 'NOT CONFIRMED'}: without cuDNN SDPA, bf16 "
            f"output tok/s x{hf_gain:.1f} (HF) and x{eng_gain:.1f} (engine torch backend); new-shape SDPA call "
            f"{per_call['default (cuDNN allowed)'] * 1e3:.2f} ms with cuDNN vs {per_call['without cuDNN'] * 1e3:.3f} ms "
            "without. (Confirmed = cuDNN picked for bf16 decode, >3x per new shape, >2x end to end for both.)", "")
    best_bf16 = tok["engine default: Triton + CUDA graphs bfloat16"]
    best_fp32 = tok["engine default: Triton + CUDA graphs float32"]
    rep.target(best_bf16 >= 0.9 * best_fp32,
              f"engine default path: bf16 not slower than fp32 ({best_bf16:,.0f} vs {best_fp32:,.0f} tok/s)")


if __name__ == "__main__":
    import sys
    import tempfile
    from pathlib import Path

    r = Report()
    with tempfile.TemporaryDirectory() as tmp, contextlib.suppress(KeyboardInterrupt):
        check_bf16(r, Path(tmp))
    sys.exit(1 if r.failures else 0)
