"""Which heads and columns each rank holds, and that the loader reads exactly those slices (no processes)."""
from __future__ import annotations

import pytest
import torch

from reference_engine.config import ModelConfig
from reference_engine.distributed.sharding import ShardPlan, head_ranges, split
from reference_engine.model.loader import load_model


def test_split_covers_every_item_once():
    for n, size in [(8, 2), (9, 2), (1536, 4), (3, 3)]:
        parts = [split(n, size, r) for r in range(size)]
        assert parts[0][0] == 0 and parts[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
        assert max(b - a for a, b in parts) - min(b - a for a, b in parts) <= 1


def test_heads_follow_their_kv_groups():
    assert [head_ranges(8, 2, 2, r) for r in range(2)] == [((0, 4), (0, 1)), ((4, 8), (1, 2))]
    # SmolLM2-135M: 9 heads in 3 groups of 3 over 2 ranks: 2 groups + 1 group
    assert [head_ranges(9, 3, 2, r) for r in range(2)] == [((0, 6), (0, 2)), ((6, 9), (2, 3))]
    # fewer kv heads than ranks: each kv head replicated on 2 ranks, its query heads split (vLLM's rule)
    assert [head_ranges(8, 2, 4, r) for r in range(4)] == [((0, 2), (0, 1)), ((2, 4), (0, 1)),
                                                          ((4, 6), (1, 2)), ((6, 8), (1, 2))]


@pytest.mark.parametrize("h, hkv, size, words", [(8, 2, 3, "multiple of num_key_value_heads"),
                                                 (2, 1, 4, "a rank would hold no head")])
def test_unsplittable_shapes_are_refused_in_one_line(h, hkv, size, words):
    with pytest.raises(ValueError, match=words) as e:
        head_ranges(h, hkv, size, 0)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_rank_slices_put_back_together_are_the_checkpoint(make_tiny, family):
    """Rank 0's and rank 1's qkv rows (with Qwen2's biases) and o_proj / down_proj columns, read as slices from
    safetensors, concatenate to the full model's tensors: each rank read its part and nothing else."""
    d = make_tiny(family)
    full, cfg = load_model(d, torch.float32, "cpu", 64)
    ranks = [load_model(d, torch.float32, "cpu", 64, shard=ShardPlan(ModelConfig.from_dir(d), r, 2))[0]
             for r in range(2)]
    a0, a1, af = (m.model.layers[1].self_attn for m in (*ranks, full))
    for i in range(3):  # q, k, v blocks
        for name in ["weight"] + (["bias"] if cfg.attention_bias else []):
            parts = [getattr(a.qkv_proj, name).split(a.sizes, dim=0)[i] for a in (a0, a1)]
            assert torch.equal(torch.cat(parts), getattr(af.qkv_proj, name).split(af.sizes, dim=0)[i])
    assert torch.equal(torch.cat([a0.o_proj.weight, a1.o_proj.weight], dim=1), af.o_proj.weight)
    m0, m1, mf = (m.model.layers[1].mlp for m in (*ranks, full))
    assert torch.equal(torch.cat([m0.down_proj.weight, m1.down_proj.weight], dim=1), mf.down_proj.weight)
    assert torch.equal(ranks[1].model.embed_tokens.weight, full.model.embed_tokens.weight)  # replicated


def test_torchrun_entry_refuses_to_start_outside_torchrun(monkeypatch, capsys):
    from reference_engine.distributed import torchrun

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert torchrun.main(["/nonexistent"]) == 2
    assert "start it with torchrun" in capsys.readouterr().err


def test_the_shapes_the_trace_shows_are_the_loaded_ones(make_tiny):
    d = make_tiny("qwen2")
    cfg = ModelConfig.from_dir(d)
    for r in range(2):
        plan = ShardPlan(cfg, r, 2)
        layer = load_model(d, torch.float32, "cpu", 64, shard=plan)[0].model.layers[2]
        got = {"qkv_proj": layer.self_attn.qkv_proj.weight, "o_proj": layer.self_attn.o_proj.weight,
               "gate_up_proj": layer.mlp.gate_up_proj.weight, "down_proj": layer.mlp.down_proj.weight}
        assert {k: list(v.shape) for k, v in got.items()} == plan.shapes()
