"""GPU profiles that size the run (gpu.py): the KV tokens a device holds after the weights and activations,
one rank's share under tensor parallelism, and the all-reduce a step adds."""
from __future__ import annotations

import pytest

from experiments.simulate import gpu
from experiments.simulate.replay import replica_for
from experiments.simulate.step_model import ModelShape, StepShape, load_profile, predict
from experiments.workload.config import load
from tests.experiments.exp_util import write_config
from tests.experiments.simulate.planted import planted

LLAMA_8B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256,
                      dtype="bfloat16", kv_dtype="bfloat16")


def test_an_h100_holds_what_its_memory_leaves_after_an_8b_model():
    h100 = load_profile("h100")
    s = gpu.size(h100, LLAMA_8B)
    assert s.weights == pytest.approx(16.06e9, rel=0.01)  # Llama-3.1-8B: 8.03 B parameters in bf16
    assert s.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16
    left = 80e9 * 0.92 - s.weights - s.activations - s.graph_pool
    assert s.kv_tokens == int(left // s.kv_bytes_per_token) and 400_000 < s.kv_tokens < 450_000
    assert "datasheet" in " ".join(s.sources.values()) and "vllm/config/cache.py" in s.sources["utilization"]
    assert gpu.size(h100, LLAMA_8B, utilization=0.5).kv_tokens < s.kv_tokens
    two = gpu.size(h100, LLAMA_8B, tensor=2)  # half the weights and half the KV heads per rank: over twice the tokens
    assert two.weights == pytest.approx(s.weights / 2, rel=0.01) and two.kv_tokens > 2 * s.kv_tokens
    with pytest.raises(ValueError, match="leave no KV cache"):
        gpu.size(load_profile("l40s"), ModelShape(80, 8192, 64, 8, 128, 28672, 128256, "bfloat16", "bfloat16"))


def test_fewer_kv_heads_than_ranks_are_replicated_and_shapes_must_divide():
    assert gpu.shard(LLAMA_8B, 16).kv_heads == 1  # 8 KV heads over 16 ranks: one each, not half
    assert gpu.shard(LLAMA_8B, 4).heads == 8 and gpu.shard(LLAMA_8B, 4).intermediate == 14336 // 4
    with pytest.raises(ValueError, match="does not divide"):
        gpu.shard(LLAMA_8B, 3)


def test_tensor_parallel_steps_pay_one_rank_s_share_plus_two_all_reduces_per_layer():
    h100 = load_profile("h100")
    step = StepShape(tuple((1, 1024, 1) for _ in range(64)))
    one = predict(step, LLAMA_8B, h100)
    ar = gpu.allreduce_s(step, LLAMA_8B, 2, h100)
    # 64 tokens x 4096 x 2 B, a ring's 2 (N-1)/N = 1 of it over 450 GB/s, plus 10 us, twice per layer
    assert ar == pytest.approx(2 * 32 * (64 * 4096 * 2 / 450e9 + 10e-6))
    assert predict(step, gpu.shard(LLAMA_8B, 2), h100) + ar < one
    assert gpu.allreduce_s(step, LLAMA_8B, 1, h100) == 0.0
    no_link = load_profile("h100")
    no_link.link_gbps = None
    with pytest.raises(ValueError, match="link_gbps"):
        gpu.allreduce_s(step, LLAMA_8B, 2, no_link)


def test_a_gpu_profile_sizes_the_replica_s_kv_and_reads_parallel(exp_model, tmp_path):
    """A GPU profile's replica holds what the device leaves, not the config's `[kv] tokens` (a pin chosen for
    the machine the config measures on: the README's H200 example held 4,096 tokens); `[parallel] tensor`
    reaches the replica."""
    body = 'engine = "reference"\n[workload]\nkind = "random"\nnum_requests = 2\ninput_len = 8\noutput_len = 2\n' \
           '[load]\nmode = "closed"\nconcurrency = [1]\nwarmup = 0\n[parallel]\ntensor = 2\n[kv]\ntokens = 4096\n'
    cfg = load(write_config(tmp_path / "c.toml", exp_model, body))
    h100 = load_profile("h100")
    rep = replica_for(cfg, "reference", h100, None)
    shape = ModelShape.from_dir(exp_model, cfg.dtype)
    want = gpu.size(h100, shape, 2, None, rep.cfg.max_num_batched_tokens, rep.cfg.max_num_seqs).kv_tokens
    assert rep.tensor == 2 and rep.num_blocks == want // rep.cfg.block_size and want > 100 * 4096
    cpu = replica_for(cfg, "reference", planted(), None)  # a profile without device memory keeps the pin
    assert cpu.num_blocks * cpu.cfg.block_size == 4096


def test_explain_prints_the_tokens_and_each_term_with_sources():
    text = gpu.explain(load_profile("h100"), LLAMA_8B, 2)
    assert "tokens" in text and "datasheet" in text and "all-reduce" in text and "decode x64" in text
