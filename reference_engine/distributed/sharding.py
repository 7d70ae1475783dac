"""Which weights each tensor-parallel rank holds, and the slices of the checkpoint it reads.

Megatron-style split of one decoder layer over `size` ranks:

    qkv_proj     column-parallel: rank r holds the rows of its q heads and of their kv heads
    o_proj       row-parallel:    the matching input columns; partial sums, one all-reduce
    gate_up_proj column-parallel: rank r holds its slice of the intermediate rows of gate and of up
    down_proj    row-parallel:    the matching input columns; partial sums, one all-reduce
    norms, rotary, embedding, lm_head: replicated

Heads follow their KV groups: the kv heads are split into contiguous, near-equal runs and each rank
takes the query heads that read them, so no query head ever needs another rank's keys. With fewer kv
heads than ranks, each kv head is replicated on `size // num_kv_heads` ranks (as vLLM does) and its
query heads are split between them. Runs may be uneven where the counts do not divide (SmolLM2-135M:
9 heads in 3 KV groups over 2 ranks: 6 + 3); vLLM refuses that case, the arithmetic here does not need to.

Embedding and LM head are replicated, not vocabulary-parallel: rank 0 alone samples (penalties,
logprobs, speculative verification all read whole logit rows), so a vocab-parallel head would need
an all-gather of the logits every step to get back what a replicated head computes locally, and the
workers skip the head entirely. The price is memory: every rank holds vocab x hidden twice (once if
tied); for a 128k vocabulary at 4096 hidden in bf16 that is 1 GiB per rank, which is where
vLLM's vocab-parallel head pays off.

Invariant: `apply` only reshapes modules (on the meta device, before any weight exists); `spec`
names, for a checkpoint tensor, the one slice this rank reads; concatenating every rank's slices
gives the checkpoint tensor back (kv rows of replicated heads excepted).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from reference_engine.config import ModelConfig
from reference_engine.distributed.layers import RowParallelLinear


def split(n: int, size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's near-equal contiguous share of n items (the first n % size get one more)."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def head_ranges(h: int, hkv: int, size: int, rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """-> (query heads [a, b), kv heads [c, d)) of `rank`. ValueError, one line, where no split exists."""
    g = h // hkv  # query heads per kv head
    if hkv >= size:
        c, d = split(hkv, size, rank)
        return (c * g, d * g), (c, d)
    if size % hkv:
        raise ValueError(f"tensor_parallel_size {size} must be a multiple of num_key_value_heads {hkv} "
                         f"when it exceeds it (each kv head is replicated on the same number of ranks)")
    per = size // hkv  # ranks sharing one kv head
    kv = rank // per
    if g < per:
        raise ValueError(f"tensor_parallel_size {size} exceeds num_attention_heads {h}: a rank would hold no head")
    a, b = split(g, per, rank % per)
    return (kv * g + a, kv * g + b), (kv, kv + 1)


@dataclass
class ShardPlan:
    """Rank `rank` of `size`: the heads and MLP columns it holds, for `cfg`'s shapes."""
    cfg: ModelConfig
    rank: int
    size: int
    all_reduce: object = None  # the RowParallelLinear's reduce: AllReduce (group.py) or None in tests

    def __post_init__(self) -> None:
        c = self.cfg
        if self.size > c.intermediate_size:
            raise ValueError(f"tensor_parallel_size {self.size} exceeds intermediate_size {c.intermediate_size}")
        (self.q0, self.q1), (self.kv0, self.kv1) = head_ranges(c.num_heads, c.num_kv_heads, self.size, self.rank)
        self.i0, self.i1 = split(c.intermediate_size, self.size, self.rank)

    @property
    def num_heads(self) -> int:
        return self.q1 - self.q0

    @property
    def num_kv_heads(self) -> int:
        return self.kv1 - self.kv0

    def apply(self, model: nn.Module) -> nn.Module:
        """Reshape `model`'s layers (on meta) to this rank's shard, in place."""
        c, d = self.cfg, self.cfg.head_dim
        for n, layer in enumerate(model.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            attn.h, attn.hkv = self.num_heads, self.num_kv_heads
            attn.sizes = [attn.h * d, attn.hkv * d, attn.hkv * d]
            attn.qkv_proj = nn.Linear(c.hidden_size, sum(attn.sizes), bias=c.attention_bias)
            attn.o_proj = RowParallelLinear(attn.h * d, c.hidden_size, self.all_reduce)
            i = self.i1 - self.i0
            mlp.sizes = [i, i]
            mlp.gate_up_proj = nn.Linear(c.hidden_size, 2 * i, bias=False)
            mlp.down_proj = RowParallelLinear(i, c.hidden_size, self.all_reduce)
            attn.o_proj.name, mlp.down_proj.name = f"layers.{n}.o_proj", f"layers.{n}.down_proj"
        return model

    def spec(self, name: str) -> tuple[int, int, int] | None:
        """Checkpoint tensor name -> (dim, start, stop) of the slice this rank reads, None: all of it."""
        d = self.cfg.head_dim
        rows = {"q_proj": (self.q0 * d, self.q1 * d), "k_proj": (self.kv0 * d, self.kv1 * d),
                "v_proj": (self.kv0 * d, self.kv1 * d), "gate_proj": (self.i0, self.i1), "up_proj": (self.i0, self.i1)}
        cols = {"o_proj": (self.q0 * d, self.q1 * d), "down_proj": (self.i0, self.i1)}
        for proj, (a, b) in rows.items():
            if f".{proj}." in name:
                return 0, a, b
        for proj, (a, b) in cols.items():
            if f".{proj}.weight" in name:
                return 1, a, b
        return None

    def shapes(self) -> dict[str, list[int]]:
        """This rank's weight shapes in one decoder layer (the same in every layer), `[out, in]`."""
        c, d = self.cfg, self.cfg.head_dim
        i = self.i1 - self.i0
        return {"qkv_proj": [(self.num_heads + 2 * self.num_kv_heads) * d, c.hidden_size],
                "o_proj": [c.hidden_size, self.num_heads * d], "gate_up_proj": [2 * i, c.hidden_size],
                "down_proj": [c.hidden_size, i]}

    def kv_config(self) -> ModelConfig:
        """The model config as this rank's KV cache sees it: its own query and kv heads."""
        import dataclasses

        return dataclasses.replace(self.cfg, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads)


def rank_shapes(cfg: ModelConfig, size: int) -> list[dict[str, list[int]]] | None:
    """Every rank's weight shapes in one decoder layer (`ShardPlan.shapes`), None for one rank."""
    return [ShardPlan(cfg, r, size).shapes() for r in range(size)] if size > 1 else None
