"""Loading: sharded safetensors, untied heads, rope scaling and dtypes load like HF does."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from reference_engine import LLM, SamplingParams
from tests.reference_engine.helpers import hf_greedy, random_prompts

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def _shard(model_dir, dest):
    """Rewrite a single-file checkpoint as two shards + index, the way HF saves large models."""
    import shutil

    shutil.copytree(model_dir, dest)
    tensors = load_file(str(dest / "model.safetensors"))
    (dest / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n].contiguous() for n in part}, str(dest / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (dest / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dest


def test_sharded_checkpoint_loads_identically(tiny_llama, tmp_path):
    sharded = _shard(tiny_llama, tmp_path / "sharded")
    prompts = random_prompts(1000, 3, 5, 20)
    a = LLM(str(tiny_llama)).generate(prompts, GREEDY)
    b = LLM(str(sharded)).generate(prompts, GREEDY)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="shard"):
        LLM(str(sharded))


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    {"tie_word_embeddings": False},
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}, "rope_theta": 500000.0},
])
def test_variants_match_hf(make_tiny, overrides):
    model_dir = make_tiny("llama", seed=2, **overrides)
    llm = LLM(str(model_dir))
    prompts = random_prompts(llm.engine.model_config.vocab_size, 4, 60, 120, seed=2)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == hf_greedy(str(model_dir), prompts, 16)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_and_mostly_agrees(tiny_llama, dtype):
    """Low precision changes rounding, so exact agreement is not expected; the first tokens should agree."""
    prompts = random_prompts(1000, 4, 10, 30, seed=4)
    ref = LLM(str(tiny_llama)).generate(prompts, GREEDY)
    llm = LLM(str(tiny_llama), dtype=dtype)
    assert llm.engine.runner.kv_cache[0][0].dtype == getattr(torch, dtype)
    outs = llm.generate(prompts, GREEDY)
    assert sum(o.token_ids[0] == r.token_ids[0] for o, r in zip(outs, ref)) >= 3


def test_mistral_sliding_window_caps_the_context(make_tiny):
    model_dir = make_tiny("llama", seed=0, architectures=["MistralForCausalLM"], model_type="mistral",
                          sliding_window=96)
    llm = LLM(str(model_dir))
    assert llm.engine.max_model_len == 96
    with pytest.raises(ValueError, match="context length of 96"):
        llm.generate([list(range(10, 100))], SamplingParams(max_tokens=10))
