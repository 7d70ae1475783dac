"""The KV cache's tensors: per layer (K, V), indexed by block id. Their size is the memory plan's
(`memory_plan.py`); the block ids that index them are the scheduler's (`core/block_pool.py`,
`core/kv_cache_manager.py`), and this module knows nothing of those."""
from __future__ import annotations

import torch

from reference_engine.config import ModelConfig
from reference_engine.model import hugepages


def allocate_kv_cache(model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: str | torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (K, V), each (num_blocks, block_size, kv_heads, head_dim), zeros. On CPU all of them in
    one huge-page arena (model/hugepages.py: a decode step gathers its blocks from across the cache),
    written once here so that the cache is resident from the start, as a GPU's is."""
    shape = (num_blocks, block_size, model.num_kv_heads, model.head_dim)
    if torch.device(device).type != "cpu":
        return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                for _ in range(model.num_layers)]
    arena = hugepages.Arena(2 * model.num_layers * hugepages.size(shape, dtype))
    return [(arena.take(shape, dtype).zero_(), arena.take(shape, dtype).zero_()) for _ in range(model.num_layers)]
