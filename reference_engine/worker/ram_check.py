"""The RAM check at start (CPU): refuse, in one line naming the numbers, an engine that would not fit.

On CPU the weights, their layouts, the KV cache and the activations all live in the machine's RAM. A
config that asks for more than is free does not fail cleanly by itself: the allocations succeed (Linux
overcommits) and the machine swaps, or the OOM killer ends the engine mid-run. So the engine checks
twice, and raises ValueError (`inferlab serve` / `inferlab run`: one line, exit 2) when

    parameters + layouts + KV budget + activation estimate > available

1. before loading anything (`refuse`, from `LLMEngine` and the harness's adapter): the parameters from
   the config's shapes (`weight_counts`: nothing allocated), the layouts as the bytes `pack` holds
   per byte of weight on a probe of the model's hidden x hidden shape (read, not assumed: whatever
   layouts `packed_linear` keeps), the KV budget as the runner will size it, and `activation_estimate`;
2. in the runner, just before the KV cache is allocated: the KV bytes and the activation estimate
   against what is available then (the weights are resident by now, so they are in neither side).
   The KV allocation cannot overcommit past this point.

`available()`: MemAvailable (/proc/meminfo), or the cgroup's headroom (limit - usage + inactive file
pages) where that is lower. Every figure is an estimate of a peak, not a guarantee: the check refuses
what cannot fit, it does not promise that what passes never swaps under other processes' load.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from reference_engine.config import EngineConfig, ModelConfig, resolve_dtype

GiB = float(1 << 30)
CGROUP = Path("/sys/fs/cgroup")


def _meminfo(key: str, path: str = "/proc/meminfo") -> int | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cgroup_headroom(root: Path = CGROUP) -> int | None:
    """Bytes the cgroup may still take (v2 memory.max, or v1 memory.limit_in_bytes, minus usage, plus the
    inactive file pages it would reclaim first); None without a limit."""
    for limit_f, usage_f, stat_f, inactive in (("memory.max", "memory.current", "memory.stat", "inactive_file"),
                                              ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes",
                                               "memory/memory.stat", "total_inactive_file")):
        try:
            limit = (root / limit_f).read_text().strip()
            usage = int((root / usage_f).read_text())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "no limit" as ~2^63
            return None
        stat = dict(line.split() for line in (root / stat_f).read_text().splitlines() if " " in line)
        return int(limit) - usage + int(stat.get(inactive, 0))
    return None


def available() -> tuple[int | None, str]:
    """(bytes, where read): the lower of MemAvailable and the cgroup's headroom; (None, why) off Linux."""
    mem, cg = _meminfo("MemAvailable"), cgroup_headroom()
    if cg is not None and (mem is None or cg < mem):
        return cg, "the cgroup's memory limit"
    return (mem, "MemAvailable") if mem is not None else (None, "no /proc/meminfo")


def activation_estimate(mcfg: ModelConfig, tokens: int, rows: int, elem: int = 4) -> int:
    """Bytes of one step's largest live set, from shapes: a layer's MLP input, gate/up output and activation
    (T x (H + 3I)), q/k/v (T x (H + 2 KV dims)), and `rows` logit rows over the vocabulary (float32)."""
    t, h, i, kv = tokens, mcfg.hidden_size, mcfg.intermediate_size, mcfg.num_kv_heads * mcfg.head_dim
    return elem * (t * (h + 3 * i) + t * (h + 2 * kv)) + 4 * rows * mcfg.vocab_size


def held_per_weight_byte(hidden: int, dtype: torch.dtype) -> float:
    """Bytes the engine holds for a packed projection per byte of its weight as loaded (1.0 when nothing is
    packed): `pack` run on a hidden x hidden probe, parameters kept plus every layout `layout_bytes` names."""
    from reference_engine.model import packed_linear
    from reference_engine.worker.gpu_memory import param_bytes

    probe = nn.Sequential(nn.Linear(hidden, hidden, bias=False).to(dtype))
    loaded = param_bytes(probe)
    with torch.no_grad():
        packed_linear.pack(probe)
    return (param_bytes(probe) + sum(packed_linear.layout_bytes(probe).values())) / loaded


def weight_counts(mcfg: ModelConfig) -> tuple[int, int]:
    """(parameters, weights of the projections `pack` swaps), as element counts from the config's shapes:
    a tied LM head is one parameter but a projection of its own. Biases and norms are in the first."""
    h, i, L, v = mcfg.hidden_size, mcfg.intermediate_size, mcfg.num_layers, mcfg.vocab_size
    q, kv = mcfg.num_heads * mcfg.head_dim, mcfg.num_kv_heads * mcfg.head_dim
    layer = h * q + 2 * h * kv + q * h + 3 * h * i
    extra = L * (2 * h + (q + 2 * kv if mcfg.attention_bias else 0) + (2 * mcfg.head_dim if mcfg.qk_norm else 0)) + h
    return v * h * (1 if mcfg.tie_word_embeddings else 2) + L * layer + extra, L * layer + v * h


def plan(cfg: EngineConfig) -> dict[str, int]:
    """The parts the check adds up before loading (bytes): parameters, layouts, KV cache, activations."""
    from reference_engine.worker.gpu_memory import bytes_per_token, capacity_blocks
    from reference_engine.worker.backends import with_default_backends

    cfg = with_default_backends(cfg)
    mcfg = ModelConfig.from_dir(cfg.model)
    dtype = resolve_dtype(cfg.dtype, mcfg.torch_dtype, cfg.device)
    limit = min(mcfg.max_position_embeddings, mcfg.sliding_window or mcfg.max_position_embeddings)
    max_len = min(cfg.max_model_len or limit, limit)
    elem = torch.empty((), dtype=dtype).element_size()
    params, linears = weight_counts(mcfg)
    ratio = held_per_weight_byte(mcfg.hidden_size, dtype) if cfg.linear_backend == "onednn" else 1.0
    kv = capacity_blocks(cfg, mcfg, dtype, max_len) * cfg.block_size * bytes_per_token(mcfg, dtype)
    act = activation_estimate(mcfg, cfg.max_num_batched_tokens, cfg.max_num_seqs)
    return {"parameters": params * elem, "layouts": max(0, round(linears * elem * (ratio - 1))), "KV cache": kv,
            "activations (estimate)": act}


def check(parts: dict[str, int], avail: int | None, source: str) -> None:
    """ValueError, one line naming every part and the total in GiB, when the parts exceed `avail`."""
    need = sum(parts.values())
    if avail is None or need <= avail:
        return
    terms = " + ".join(f"{k} {v / GiB:.2f}" for k, v in parts.items())
    raise ValueError(f"not enough memory to start (GiB): {terms} = {need / GiB:.2f} > {avail / GiB:.2f} available "
                     f"({source}); lower the KV budget or the batch, or free memory")


def refuse(cfg: EngineConfig) -> None:
    """The check before loading (CPU engines only; CUDA sizes its KV cache from the device). A model
    directory that does not exist is left to the engine's start, whose error names it."""
    if torch.device(cfg.device).type == "cpu" and Path(cfg.model).is_dir():
        check(plan(cfg), *available())


def check_kv(cfg: EngineConfig, mcfg: ModelConfig, kv_bytes: int) -> None:
    """Just before the KV tensors are allocated (and zeroed: every page touched): the cache as sized plus the
    activation estimate must fit what is available now, else one line (`check`)."""
    parts = {"KV cache": kv_bytes,
             "activations (estimate)": activation_estimate(mcfg, cfg.max_num_batched_tokens, cfg.max_num_seqs)}
    check(parts, *available())
