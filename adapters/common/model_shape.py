"""Model-shape arithmetic from a model folder's config.json and safetensors headers: parameter
count, weight bytes, and the KV bytes one token occupies (per GPU under tensor parallelism).

It sits below both `adapters` (sizing an engine's KV budget in bytes) and `experiments`
(the decode-bandwidth estimate, experiments/measuring/bandwidth.py), and imports neither.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def param_count(model_dir: str | Path) -> int:
    """Sum of tensor sizes in the model's safetensors files (header only; no weights read)."""
    total = 0
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors in {model_dir}")
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                total += int(np.prod(t["shape"], dtype=np.int64))
    return total


def attention_shape(model_dir: str | Path) -> dict[str, int]:
    """layers, attention heads, KV heads and head dim from config.json (KeyError/OSError if absent)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    return {"layers": cfg["num_hidden_layers"], "heads": heads,
            "kv_heads": cfg.get("num_key_value_heads") or heads,
            "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads}


def kv_bytes_per_token(model_dir: str | Path, dtype: str, tensor_parallel: int = 1) -> int:
    """K and V bytes one token occupies on *one GPU*: with tensor parallelism the KV heads are
    split across the GPUs (each keeps at least one head, replicated when there are fewer
    heads than GPUs), so a per-GPU byte budget holds `tensor_parallel` times fewer bytes."""
    a = attention_shape(model_dir)
    heads_here = max(1, a["kv_heads"] // max(1, int(tensor_parallel)))
    return 2 * a["layers"] * heads_here * a["head_dim"] * DTYPE_BYTES[dtype]


def model_shape(model_dir: str | Path, dtype: str) -> dict[str, Any]:
    """Weights and KV sizes of the whole model (one GPU's worth, no parallelism)."""
    a = attention_shape(model_dir)
    b, params = DTYPE_BYTES[dtype], param_count(model_dir)
    return {"params": params, "weight_bytes": params * b,
            "kv_bytes_per_token": kv_bytes_per_token(model_dir, dtype),
            "layers": a["layers"], "kv_heads": a["kv_heads"], "head_dim": a["head_dim"], "dtype_bytes": b}


def context_length(model_dir: str | Path) -> int | None:
    """The model's own context (config.json max_position_embeddings), None where the folder does not say."""
    try:
        return int(json.loads((Path(model_dir) / "config.json").read_text())["max_position_embeddings"])
    except (OSError, KeyError, ValueError, TypeError):
        return None
