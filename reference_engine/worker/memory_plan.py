"""The memory plan: what start-up puts in memory, made once from the config and checked against what is
free before anything is allocated. The runner keeps it (`ModelRunner.plan`); the memory split
(`ModelRunner.memory`), `/server_info` (`ModelRunner.settings`, read by `effective_config`) and the RAM
check (`check_ram`, exported as `reference_engine.check_ram`) all read this one object.

    device total = weights + layouts + KV cache + activations (peak) + CUDA graph pool
                   + memory torch does not manage (CUDA context, cuBLAS and Triton modules)
                   + free (and other processes)

One object, filled at two moments (both methods here):
1. `MemoryPlan.make`, before any weight is loaded: the dtype and context length the runner will use, the
   parameters from the config's shapes (`weight_counts`), the layouts as `pack` holds them per byte of
   weight on a hidden x hidden probe (`held_per_weight_byte`: read, not assumed), the KV cache as sized
   from the config's budget (`capacity_blocks`), one step's activations estimated from shapes
   (`activation_estimate`), and free RAM, read once (`device_memory.free_ram`). `check` (CPU) refuses
   parameters + layouts + KV + activations > free RAM in one line (ValueError; `inferlab serve` /
   `inferlab run`: exit 2): Linux overcommits, so a config that does not fit fails nowhere by itself (the
   machine swaps, or the OOM killer ends the engine mid-run).
2. `fit`, once the weights are loaded: the weights and layouts as held, the activation peak (CUDA: one
   profile forward over a full token budget), and the KV cache from them. With `gpu_memory_utilization`
   (CUDA) vLLM's rule (`kv_budget`): the engine may use `utilization x total`; the KV cache gets what is
   left after the weights, the activation peak, the memory torch does not manage, and a reserve for CUDA
   graphs (the activation peak once more: a graph's bucket holds at most that many tokens); if less
   than that share was free before loading, it is an error, as in vLLM. Otherwise the config's budget
   in tokens or bytes, now with a draft model's KV per token. With TP every rank takes the smallest cache.
   On CPU the KV cache and the activation estimate are checked once more, against free RAM read then: a
   second check remains because the first could only estimate the weights and layouts (and knows no
   draft model), other processes may have taken memory while they loaded, and the KV tensors are zeroed
   as they are allocated (every page touched), so this is the last point a cache that cannot fit is
   refused cleanly. The weights are resident by then, so they are in neither side.

Every figure is an estimate of a peak, not a guarantee: the check refuses what cannot fit; it does not
promise that what passes never swaps under other processes' load.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from reference_engine.config import DEFAULT_KV_BYTES, EngineConfig, ModelConfig, resolve_dtype
from reference_engine.model import packed_linear
from reference_engine.worker.backends import with_default_backends
from reference_engine.worker.device_memory import DeviceMemory, free_ram
from reference_engine.worker.input_batch import make_batch
from reference_engine.worker.kv_cache import allocate_kv_cache

GiB = float(1 << 30)


def gib(n: int | float) -> str:
    return f"{n / GiB:.2f} GiB"


@dataclass
class MemoryPlan:
    """Bytes, as planned before loading and as held after `fit` (see the module docstring)."""

    cfg: EngineConfig = field(repr=False)  # with its backends chosen (`backends.with_default_backends`)
    dtype: torch.dtype  # the weights' and the KV cache's
    max_model_len: int
    weights: int  # the parameters: from the config's shapes, then as held (tied weights once, no layout)
    layouts: dict[str, int]  # weight layouts beside them: {"estimate": ...}, then `packed_linear.layout_bytes`
    kv_bytes_per_token: int  # K and V, every layer (this rank's heads after `fit`), a draft model's included
    num_blocks: int
    activation_estimate: int  # one step's largest live set, from shapes
    free: int | None  # what the plan is checked against: free RAM (CPU), the device's free bytes (CUDA)
    free_source: str  # where `free` was read
    activation_peak: int | None = None  # CUDA: the profile forward's
    graph_reserve: int = 0  # CUDA graphs: what the KV budget leaves for their pool
    graph_pool: int | None = None  # CUDA: the pool as captured (the runner records it)
    non_torch: int = 0  # CUDA: memory taken while loading that torch's allocator does not hold
    total: int | None = None  # CUDA: the device's bytes
    runtime_base: int | None = None  # CPU: the process's RSS before any weight (interpreter, libraries)
    rank_weights: list[int] = field(default_factory=list)  # TP: bytes held for weights, per rank

    @classmethod
    def make(cls, cfg: EngineConfig, mcfg: ModelConfig | None = None, check: bool = False) -> MemoryPlan:
        """The plan before loading, from the config's shapes alone (nothing is allocated); `check`: and `check`ed."""
        mcfg = mcfg or ModelConfig.from_dir(cfg.model)
        dtype = resolve_dtype(cfg.dtype, mcfg.torch_dtype, cfg.device)  # "auto": as vLLM's
        per_tok = mcfg.kv_bytes_per_token(dtype)
        limit = min(mcfg.max_position_embeddings, mcfg.sliding_window or mcfg.max_position_embeddings)  # sliding = full
        max_len = min(cfg.max_model_len or limit, limit)
        elem = torch.empty((), dtype=dtype).element_size()
        params, linears = weight_counts(mcfg)
        ratio = held_per_weight_byte(mcfg.hidden_size, dtype) if cfg.linear_backend == "onednn" else 1.0
        cpu = torch.device(cfg.device).type == "cpu"
        free, source = free_ram() if cpu else (None, "read before loading")  # read last: nearest the check
        plan = cls(cfg, dtype, max_len, params * elem, {"estimate": max(0, round(linears * elem * (ratio - 1)))},
                   per_tok, capacity_blocks(cfg, mcfg, dtype, max_len, per_tok=per_tok),
                   activation_estimate(mcfg, cfg.max_num_batched_tokens, cfg.max_num_seqs), free, source)
        if check:
            plan.check()
        return plan

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.cfg.block_size * self.kv_bytes_per_token

    def parts(self) -> dict[str, int]:
        """What the check adds up (bytes)."""
        return {"parameters": self.weights, "layouts": sum(self.layouts.values()), "KV cache": self.kv_bytes,
                "activations (estimate)": self.activation_estimate}

    def check(self) -> None:
        """Before loading (CPU engines; CUDA sizes its KV cache from the device in `fit`): one-line
        ValueError when the parts exceed free RAM."""
        if torch.device(self.cfg.device).type == "cpu":
            refuse(self.parts(), self.free, self.free_source)

    def fit(self, model: nn.Module, mcfg: ModelConfig, kv_cfg: ModelConfig, draft, mem: DeviceMemory, backend_cls,
            graphs: bool, tp=None, runtime_base: int | None = None) -> None:
        """After loading (and packing): the weights and layouts as held, the activation peak (CUDA), and the
        KV cache's blocks; on CPU the second check. `mcfg`: the model's config as loaded, `kv_cfg`: as this
        rank's KV cache sees it (its heads); `draft`: the proposer (its model and KV per token) or None;
        `mem`: the device's reader, made before loading (`mem.start`); `graphs`: whether CUDA graphs will be captured; `tp`: the
        rank's group (`fit` runs its collectives: every rank calls it)."""
        cfg = self.cfg
        draft_kv_per_token = draft.kv_bytes_per_token if draft is not None else 0
        self.runtime_base = runtime_base
        self.weights = param_bytes(model, getattr(draft, "model", None))
        self.layouts = packed_linear.layout_bytes(model) if cfg.linear_backend == "onednn" else {}
        self.kv_bytes_per_token = kv_cfg.kv_bytes_per_token(self.dtype) + draft_kv_per_token
        if mem.cuda:
            self.activation_peak = self._profile(model, mcfg, backend_cls, mem)
        if cfg.gpu_memory_utilization is not None:
            start = mem.start
            self.free, self.total, self.free_source = start.free, start.total, "torch.cuda.mem_get_info before loading"
            self.non_torch = mem.non_torch_since(start)
            self.graph_reserve = self.activation_peak if graphs else 0
            budget = kv_budget(cfg.gpu_memory_utilization, start.total, start.free, self.weights, self.activation_peak,
                               self.non_torch, self.graph_reserve)
            self.num_blocks = budget // (self.kv_bytes_per_token * cfg.block_size)
        else:
            per_tok = mcfg.kv_bytes_per_token(self.dtype) + draft_kv_per_token  # the whole model's, as before loading
            self.num_blocks = capacity_blocks(cfg, mcfg, self.dtype, self.max_model_len, per_tok=per_tok)
        if tp is not None:  # every rank indexes the same block ids: the smallest cache decides
            self.num_blocks = tp.min(self.num_blocks)
            self.rank_weights = tp.gather(self.weights + sum(self.layouts.values()))
        if self.num_blocks < 1:
            raise ValueError(f"the KV cache must hold at least one block, got {self.num_blocks}")
        if mem.device.type == "cpu":  # the KV tensors are zeroed (every page touched): refuse what cannot fit
            refuse({"KV cache": self.kv_bytes, "activations (estimate)": self.activation_estimate}, *free_ram())

    @torch.inference_mode()
    def _profile(self, model: nn.Module, mcfg: ModelConfig, backend_cls, mem: DeviceMemory) -> int:
        """Peak activation bytes of one forward over a full token budget (`max_num_batched_tokens`, in
        sequences of at most max_model_len) with logits for up to `max_num_seqs` rows, on a scratch KV
        cache just big enough, as torch's allocator measures it."""
        cfg, bs, ml, dev = self.cfg, self.cfg.block_size, self.max_model_len, mem.device
        n = min(cfg.max_num_batched_tokens, cfg.max_num_seqs * ml)
        seqs, first = [], 0
        for s in range(0, n, ml):
            length = min(ml, n - s)
            nb = -(-length // bs)
            seqs.append(([0] * length, 0, list(range(first, first + nb))))
            first += nb
        scratch = allocate_kv_cache(mcfg, first, bs, self.dtype, dev)
        batch = make_batch(seqs, bs, dev)
        rows = torch.arange(n - min(n, cfg.max_num_seqs), n, device=dev)
        mem.reset_peak()
        before = mem.allocated()
        hidden = model(batch.input_ids, batch.positions, backend_cls(scratch, bs), batch.meta)
        model.logits(hidden[rows]).argmax(-1)
        peak = mem.peak() - before
        del hidden, scratch
        mem.empty_cache()
        return max(0, peak)

    def split(self) -> dict[str, int]:
        """The memory split's planned and measured parts (bytes): weights, kv_bytes_per_token, kv_allocated;
        weights_rank<r> (TP), layout_<name>, runtime_base (CPU), activation_peak and graph_pool (CUDA)."""
        out = {"weights": self.weights, "kv_bytes_per_token": self.kv_bytes_per_token, "kv_allocated": self.kv_bytes}
        out.update({f"weights_rank{r}": b for r, b in enumerate(self.rank_weights)})
        out.update({f"layout_{k}": v for k, v in self.layouts.items()})
        extra = {"runtime_base": self.runtime_base, "activation_peak": self.activation_peak,
                 "graph_pool": self.graph_pool}
        out.update({k: v for k, v in extra.items() if v is not None})
        return out


def refuse(parts: dict[str, int], free: int | None, source: str) -> None:
    """ValueError, one line naming every part and the total in GiB, when the parts exceed `free`."""
    need = sum(parts.values())
    if free is None or need <= free:
        return
    terms = " + ".join(f"{k} {v / GiB:.2f}" for k, v in parts.items())
    raise ValueError(f"not enough memory to start (GiB): {terms} = {need / GiB:.2f} > {free / GiB:.2f} available "
                     f"({source}); lower the KV budget or the batch, or free memory")


def check_ram(cfg: EngineConfig) -> None:
    """The plan's check for a config, before anything is built (`reference_engine.check_ram`). CPU engines
    only (CUDA sizes its KV cache from the device); a model directory that does not exist is left to the
    engine's start, whose error names it."""
    if torch.device(cfg.device).type == "cpu" and Path(cfg.model).is_dir():
        MemoryPlan.make(with_default_backends(cfg)).check()


def param_bytes(*modules: nn.Module | None) -> int:
    """Bytes of the modules' parameters and buffers, each storage counted once (tied weights)."""
    seen, total = set(), 0
    for m in modules:
        if m is None:
            continue
        for t in list(m.parameters()) + list(m.buffers()):
            key = (t.device, t.untyped_storage().data_ptr())
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


def weight_counts(mcfg: ModelConfig) -> tuple[int, int]:
    """(parameters, weights of the projections `pack` swaps), as element counts from the config's shapes:
    a tied LM head is one parameter but a projection of its own. Biases and norms are in the first."""
    h, i, L, v = mcfg.hidden_size, mcfg.intermediate_size, mcfg.num_layers, mcfg.vocab_size
    q, kv = mcfg.num_heads * mcfg.head_dim, mcfg.num_kv_heads * mcfg.head_dim
    layer = h * q + 2 * h * kv + q * h + 3 * h * i
    extra = L * (2 * h + (q + 2 * kv if mcfg.attention_bias else 0) + (2 * mcfg.head_dim if mcfg.qk_norm else 0)) + h
    return v * h * (1 if mcfg.tie_word_embeddings else 2) + L * layer + extra, L * layer + v * h


def held_per_weight_byte(hidden: int, dtype: torch.dtype) -> float:
    """Bytes the engine holds for a packed projection per byte of its weight as loaded (1.0 when nothing is
    packed): `pack` run on a hidden x hidden probe, parameters kept plus every layout `layout_bytes` names."""
    probe = nn.Sequential(nn.Linear(hidden, hidden, bias=False).to(dtype))
    loaded = param_bytes(probe)
    with torch.no_grad():
        packed_linear.pack(probe)
    return (param_bytes(probe) + sum(packed_linear.layout_bytes(probe).values())) / loaded


def activation_estimate(mcfg: ModelConfig, tokens: int, rows: int, elem: int = 4) -> int:
    """Bytes of one step's largest live set, from shapes: a layer's MLP input, gate/up output and activation
    (T x (H + 3I)), q/k/v (T x (H + 2 KV dims)), and `rows` logit rows over the vocabulary (float32)."""
    t, h, i, kv = tokens, mcfg.hidden_size, mcfg.intermediate_size, mcfg.num_kv_heads * mcfg.head_dim
    return elem * (t * (h + 3 * i) + t * (h + 2 * kv)) + 4 * rows * mcfg.vocab_size


def capacity_blocks(cfg: EngineConfig, model: ModelConfig, dtype: torch.dtype, max_model_len: int,
                    per_tok: int | None = None) -> int:
    """Blocks from the budget given in tokens or bytes (default: DEFAULT_KV_BYTES, capped). `per_tok`: KV bytes
    per token when not the model's alone (a draft model's KV lives in the same block ids)."""
    per_tok = per_tok or model.kv_bytes_per_token(dtype)
    if cfg.kv_cache_tokens is not None:
        tokens = cfg.kv_cache_tokens
    elif cfg.kv_cache_bytes is not None:
        tokens = cfg.kv_cache_bytes // per_tok
    else:
        tokens = min(DEFAULT_KV_BYTES // per_tok, cfg.max_num_seqs * max_model_len)
    return tokens // cfg.block_size


def kv_budget(utilization: float, total: int, free_at_start: int, weights: int, activation_peak: int,
              non_torch: int, graph_reserve: int = 0) -> int:
    """Bytes the KV cache may take (vLLM's gpu_memory_utilization rule; see the module docstring).
    One-line ValueError when the share is not free at start or leaves nothing for the cache."""
    requested = int(total * utilization)
    if requested > free_at_start:
        raise ValueError(f"gpu_memory_utilization {utilization} asks for {gib(requested)} of {gib(total)}, but only "
                         f"{gib(free_at_start)} was free at start; lower it or free the device")
    taken = weights + activation_peak + non_torch + graph_reserve
    if requested - taken <= 0:
        raise ValueError(f"gpu_memory_utilization {utilization} leaves no room for the KV cache: {gib(requested)} "
                         f"< weights {gib(weights)} + activations {gib(activation_peak)} + non-torch "
                         f"{gib(non_torch)} + graph reserve {gib(graph_reserve)}; raise it or use kv_cache_tokens")
    return requested - taken
