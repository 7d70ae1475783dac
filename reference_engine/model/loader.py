"""Model loading: HF `config.json` + `*.safetensors` (single file or sharded) -> our `CausalLM`.

Weights are copied by name; names our layers don't have (e.g. old checkpoints' rotary
`inv_freq` buffers) are ignored, names we need but the files lack are an error.

With a shard plan (tensor parallelism, `distributed/sharding.py`) the model is reshaped to the rank's
shard before any weight exists, and each sharded tensor is read as the rank's slice only
(`safe_open(...).get_slice(name)[a:b]`): no rank ever holds the whole model.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from reference_engine.config import ModelConfig
from reference_engine.distributed.sharding import ShardPlan
from reference_engine.model.llama import CausalLM, RotaryEmbedding

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# checkpoint projection -> (our stacked parameter, which row block)
STACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


def _target(name: str, model: CausalLM) -> tuple[str, tuple[int, int] | None]:
    """HF name -> (our parameter name, row range within it, or None for the whole tensor)."""
    for src, (dst, idx) in STACKED.items():
        if f".{src}." in name:
            fused = name.replace(f".{src}.", f".{dst}.")
            owner = model.get_submodule(fused.rsplit(".", 2)[0])  # the attention or MLP module
            start = sum(owner.sizes[:idx])
            return fused, (start, start + owner.sizes[idx])
    return name, None


def _sources(param: str, model: CausalLM) -> list[str]:
    """Our parameter name -> the checkpoint names that fill it."""
    for src, (dst, _) in STACKED.items():
        if f".{dst}." in param:
            return [param.replace(f".{dst}.", f".{s}.") for s, (d, _) in STACKED.items() if d == dst]
    return [param]


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"malformed {index.name} in {model_dir}: {e}") from e
        files = [model_dir / s for s in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{model_dir} lacks shard(s) named in its index: {', '.join(missing)}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in model directory {model_dir}")
    return files


def read(handle, name: str, shard) -> torch.Tensor:
    """The checkpoint tensor `name`, or only the slice `shard.spec(name)` names (dim 0 or 1)."""
    spec = shard.spec(name) if shard is not None else None
    if spec is None:
        return handle.get_tensor(name)
    dim, a, b = spec
    part = handle.get_slice(name)
    return part[a:b] if dim == 0 else part[:, a:b]


def load_model(model_dir: str | Path, dtype: torch.dtype, device: str | torch.device,
               max_len: int, shard=None) -> tuple[CausalLM, ModelConfig]:
    """`shard`: a `distributed.sharding.ShardPlan` (this rank's part of the weights), or None: all."""
    model_dir = Path(model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    files = safetensors_files(model_dir)
    with torch.device("meta"):
        model = CausalLM(cfg, max_len)
        if shard is not None:
            shard.apply(model)
    model = model.to_empty(device=device).to(dtype)
    if cfg.tie_word_embeddings:  # to_empty breaks the tie; restore it
        model.lm_head.weight = model.model.embed_tokens.weight
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for f in files:
        try:
            handle = safe_open(str(f), framework="pt", device="cpu")
        except Exception as e:  # safetensors raises its own error types on corrupt headers
            raise ValueError(f"cannot read weights file {f}: {e}") from e
        with handle:
            for name in handle.keys():
                if name.endswith(_IGNORED_SUFFIXES) or (cfg.tie_word_embeddings and name == "lm_head.weight"):
                    continue
                target, rows = _target(name, model)
                if target not in params:
                    raise ValueError(f"{f.name} holds {name!r}, which a {cfg.architecture} does not have")
                dest = params[target] if rows is None else params[target][rows[0]:rows[1]]
                t = read(handle, name, shard)
                if t.shape != dest.shape:
                    raise ValueError(f"{name}: checkpoint shape {tuple(t.shape)} != expected {tuple(dest.shape)}")
                with torch.no_grad():
                    dest.copy_(t.to(dtype))
                loaded.add(name)
    expected = {n for p in params for n in _sources(p, model)} - ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    missing = sorted(expected - loaded)
    if missing:
        raise ValueError(f"weights missing from {model_dir}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    model.rope = RotaryEmbedding(cfg, max_len).to(device)  # buffers were not materialised on meta
    return model.eval(), cfg


def dummy_model(model_dir: str, dtype: torch.dtype, device: torch.device, max_len: int,
                seed: int = 0, shard: ShardPlan | None = None) -> tuple[CausalLM, ModelConfig]:
    """`load_format="dummy"`: the model's shape with random weights made on the device, no file read
    (as `AutoModelForCausalLM.from_config` initialises them: N(0, 0.02), norms 1, biases 0)."""
    cfg = ModelConfig.from_dir(model_dir)
    with torch.device("meta"):
        model = CausalLM(cfg, max_len).to(dtype)
        if shard is not None:
            shard.apply(model).to(dtype)
    model = model.to_empty(device=device)
    if cfg.tie_word_embeddings:  # to_empty breaks the tie; restore it
        model.lm_head.weight = model.model.embed_tokens.weight
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=gen)
    model.rope = RotaryEmbedding(cfg, max_len).to(device)
    return model.eval(), cfg
