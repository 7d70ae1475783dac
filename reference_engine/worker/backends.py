"""The backends a config leaves None, chosen for its device: one place, read by the runner, the RAM check
and `effective_config`, so that all of them agree on what runs."""
from __future__ import annotations

import copy

from reference_engine.attention import default_attention_backend
from reference_engine.config import EngineConfig
from reference_engine.model import fused_ops, packed_linear


def with_default_backends(cfg: EngineConfig) -> EngineConfig:
    """The config with every backend it leaves None chosen for its device, each by the module that
    implements it; everything built from the result (runner, draft model, effective_config) agrees.
    A copy: the caller's config is left as given (it was validated when it was made)."""
    out = copy.copy(cfg)
    out.attention_backend = cfg.attention_backend or default_attention_backend(cfg.device)
    out.linear_backend = cfg.linear_backend or packed_linear.default_backend(cfg.device)
    out.fused_ops = fused_ops.default_on(cfg.device) if cfg.fused_ops is None else cfg.fused_ops
    return out
