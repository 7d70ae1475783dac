from __future__ import annotations

import pytest
import torch

from reference_engine.config import EngineConfig, ModelConfig
from reference_engine.core.block_pool import BlockPool
from reference_engine.worker.kv_cache import allocate_kv_cache
from reference_engine.worker.memory_plan import capacity_blocks


def test_pool_allocate_free_roundtrip():
    pool = BlockPool(8, 16)
    a = pool.allocate(3)
    b = pool.allocate(5)
    assert len(set(a) | set(b)) == 8 and not pool.can_allocate(1)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        pool.allocate(1)
    pool.free(a)
    assert pool.num_free == 3 and pool.num_used == 5
    pool.free(b)
    assert pool.num_free == 8
    with pytest.raises(AssertionError, match="freed twice"):
        pool.free([b[0]])


def test_capacity_from_tokens_or_bytes(tiny_llama):
    mc = ModelConfig.from_dir(tiny_llama)
    per_tok = mc.kv_bytes_per_token(torch.float32)
    assert per_tok == 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * 4
    assert capacity_blocks(EngineConfig(str(tiny_llama), kv_cache_tokens=1000, block_size=16), mc, torch.float32, 512) == 62
    assert capacity_blocks(EngineConfig(str(tiny_llama), kv_cache_bytes=per_tok * 160, block_size=16), mc,
                           torch.float32, 512) == 10
    cache = allocate_kv_cache(mc, 10, 16, torch.float32, "cpu")
    assert len(cache) == mc.num_layers
    assert cache[0][0].shape == (10, 16, mc.num_kv_heads, mc.head_dim)
