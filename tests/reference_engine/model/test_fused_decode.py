"""fused_decode.FusedDecode: an all-decode step (fp32 or bf16) through one C++ call per
layer gives the module path's hidden states bit for bit, HF's greedy tokens, and is skipped where it
does not apply."""
from __future__ import annotations

import pytest
import torch

from reference_engine import LLM, SamplingParams
from reference_engine.kernels import ops
from reference_engine.model import packed_linear
from reference_engine.model.packed_linear import PackedLinear
from tests.reference_engine.helpers import hf_argmax_along, random_prompts

builds = pytest.mark.skipif(not (ops.available() and packed_linear.linear_kernel() == "inferlab"),
                            reason="the layer kernel or the C++ GEMM does not build here")


def _llm(model_dir) -> LLM:
    """An fp32 engine on its CPU defaults: where the kernels build, the fast path must be on."""
    llm = LLM(str(model_dir), dtype="float32")
    assert llm.engine.runner.fast_decode is not None
    return llm


@builds
@pytest.mark.parametrize("family,n", [("tiny_llama", 6), ("tiny_qwen2", 6),  # qwen2: the qkv projection has a bias
                                      ("tiny_llama", 18)])  # a decode batch of more than 12 rows
def test_every_fast_step_equals_the_module_path_and_hf(family, n, request, monkeypatch):
    model_dir = request.getfixturevalue(family)
    llm = _llm(model_dir)
    runner = llm.engine.runner
    fast, seen = runner.fast_decode, []
    real = fast.forward

    def both(ids, positions, meta):
        got = real(ids, positions, meta)
        # the module path over the same step: it writes the same K/V to the same slots again
        want = runner.model(ids, positions, runner.backend, meta)
        seen.append((ids.shape[0], torch.equal(got, want)))
        return got

    monkeypatch.setattr(fast, "forward", both)
    assert fast.max_rows == PackedLinear.MID_M  # the panel GEMM serves every row count: the call reaches MID_M
    prompts = random_prompts(llm.engine.model_config.vocab_size, n, seed=3)
    params = [SamplingParams(max_tokens=4 + 3 * (i % 6), temperature=0.0, ignore_eos=True) for i in range(n)]
    outs = llm.generate(prompts, params)
    assert seen and all(same for _, same in seen), seen
    rows = {r for r, _ in seen}  # batches shrink as requests finish
    assert n in rows and min(rows) < n
    hf = hf_argmax_along(str(model_dir), prompts, [o.token_ids for o in outs])
    assert [list(o.token_ids) for o in outs] == hf


@builds
def test_bf16_fast_steps_on_the_panels_equal_the_module_path(tiny_qwen2, monkeypatch):
    """Every product the bf16 panel GEMM (bf16's default), called from C++: the modules'
    hidden states bit for bit; 2 bytes per weight held (the panels, no parameter, no oneDNN copy) plus
    norms, biases and rope tables."""
    llm = LLM(str(tiny_qwen2), dtype="bfloat16")  # qwen2: the qkv bias goes through the kernel's epilogue
    assert llm.engine.effective_config()["bytes_per_weight"] <= 2.25
    runner = llm.engine.runner
    fast, seen = runner.fast_decode, []
    real = fast.forward

    def both(ids, positions, meta):
        got = real(ids, positions, meta)
        seen.append((ids.shape[0], torch.equal(got, runner.model(ids, positions, runner.backend, meta))))
        return got

    monkeypatch.setattr(fast, "forward", both)
    prompts = random_prompts(llm.engine.model_config.vocab_size, 16, seed=5)
    llm.generate(prompts, [SamplingParams(max_tokens=3 + i % 5, temperature=0.0, ignore_eos=True) for i in range(16)])
    assert seen and all(same for _, same in seen), seen
    assert 16 in {r for r, _ in seen} and fast.max_rows == PackedLinear.MID_M


@builds
def test_only_all_decode_steps_of_at_most_max_rows_take_it(tiny_llama, monkeypatch):
    llm = _llm(tiny_llama)
    fast = llm.engine.runner.fast_decode
    assert fast.max_rows == PackedLinear.MID_M
    calls = []
    real = fast.forward
    monkeypatch.setattr(fast, "forward", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    n = fast.max_rows + 2
    prompts = random_prompts(llm.engine.model_config.vocab_size, n, lo=5, hi=20, seed=1)
    llm.generate(prompts, [SamplingParams(max_tokens=2 if i < 2 else 5, temperature=0.0, ignore_eos=True)
                           for i in range(n)])
    # the prefill step and the decode step at max_rows + 2 rows ran the modules; once two requests
    # finished, the remaining max_rows decoding rows took the fast path
    assert calls and max(calls) == fast.max_rows


def test_it_is_off_where_it_does_not_apply(tiny_qwen3, tiny_llama, monkeypatch):
    qwen3 = LLM(str(tiny_qwen3), dtype="float32").engine.runner
    assert qwen3.fast_decode is None and "family='qwen3'" in qwen3.fast_decode_refusal  # refused by name
    # bf16 takes it by default: its weights are pair panels, multiplied in bf16 pairs on any CPU
    bf16 = LLM(str(tiny_llama), dtype="bfloat16").engine.runner.fast_decode
    assert (bf16 is not None) == ops.available()
    unfused = LLM(str(tiny_llama), dtype="float32", fused_ops=False).engine.runner
    assert unfused.fast_decode is None and unfused.fast_decode_refusal == "fused_ops off"
    monkeypatch.setenv("INFERLAB_FUSED_DECODE", "0")
    assert LLM(str(tiny_llama), dtype="float32").engine.runner.fast_decode is None
    monkeypatch.setenv("INFERLAB_FUSED_DECODE", "1")
    monkeypatch.setenv("INFERLAB_LINEAR", "onednn")  # fp32 on oneDNN's copy: the modules serve
    packed_linear.linear_kernel.cache_clear()
    try:
        assert LLM(str(tiny_llama), dtype="float32").engine.runner.fast_decode is None
    finally:
        monkeypatch.delenv("INFERLAB_LINEAR")
        packed_linear.linear_kernel.cache_clear()


@builds
def test_bf16_greedy_on_the_panels_agrees_with_the_onednn_path(tiny_llama, monkeypatch):
    """The same bf16 model on the panels and on INFERLAB_LINEAR=onednn: both round each product's fp32 sum
    to bf16 once, in different summation orders, so a token may flip where two logits tie within bf16's
    precision; on this model and these prompts at least 90 % of the greedy tokens agree."""
    llm = LLM(str(tiny_llama), dtype="bfloat16")  # bf16's default: the pair panels
    assert llm.engine.runner.model.lm_head.panels is not None
    prompts = random_prompts(llm.engine.model_config.vocab_size, 8, seed=11)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    panels = [list(o.token_ids) for o in llm.generate(prompts, params)]
    monkeypatch.setenv("INFERLAB_LINEAR", "onednn")
    packed_linear.linear_kernel.cache_clear()
    try:
        llm = LLM(str(tiny_llama), dtype="bfloat16")
        assert llm.engine.runner.model.lm_head.panels is None
        onednn = [list(o.token_ids) for o in llm.generate(prompts, params)]
    finally:
        monkeypatch.delenv("INFERLAB_LINEAR")
        packed_linear.linear_kernel.cache_clear()
    same = sum(a == b for p, o in zip(panels, onednn) for a, b in zip(p, o))
    assert same >= 0.9 * sum(len(p) for p in panels), (panels, onednn)
