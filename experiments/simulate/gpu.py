"""A GPU profile that sizes the run: how many KV tokens fit the device, and what tensor parallelism
adds to a step.

KV capacity, as vLLM sizes it (`gpu_memory_utilization`, the worker's profile run; vllm/config/cache.py,
0.32.0: default 0.92): the device's memory x the utilization, less the weights each rank holds, less
one step's activations at the full token budget, less the CUDA graph pool; what is left, over the KV
bytes per token of one rank, is the cache. The activations come from the shapes (the same live set the
reference engine's RAM check estimates: a layer's MLP input, gate/up and activation, q/k/v, and the
logit rows of one step), and the graph pool is a stated reserve; both are estimates and say so.

Tensor parallelism (`[parallel] tensor = N`): each rank holds 1/N of the heads, the KV heads (at least one
each: a model with fewer KV heads than ranks replicates them, as vLLM does), the MLP and the LM head;
each layer adds two all-reduces of the step's activations (after attention and after the MLP), a ring's
2 (N - 1) / N of the bytes over the link's one-way bandwidth each, plus a fixed latency per collective.
The profile's `link_gbps` is the per-GPU NVLink (or PCIe) bandwidth in one direction, from its datasheet.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from experiments.simulate.step_model import DTYPE_BYTES, ModelShape, Profile, StepShape

VLLM_UTILIZATION = 0.92  # vllm/config/cache.py CacheConfig.gpu_memory_utilization, 0.32.0
GRAPH_POOL_BYTES = 1 << 30  # CUDA graph pool reserve: an estimate (vLLM's capture of ~67 sizes took ~0.5-1 GiB)
ALLREDUCE_LATENCY_S = 10e-6  # one NCCL collective's fixed cost at small sizes: an estimate


@dataclass(frozen=True)
class Sizing:
    """What fits one device of the profile (bytes unless named); `sources` say where each number is from."""
    device: float
    utilization: float
    weights: float  # one rank's
    activations: float
    graph_pool: float
    kv_bytes_per_token: float  # one rank's
    kv_tokens: int
    tensor: int
    sources: dict

    def lines(self) -> list[str]:
        g = 1e9
        return [f"device {self.device / g:.1f} GB x utilization {self.utilization:.2f} = {self.device * self.utilization / g:.1f} GB",
                f"  - weights per rank {self.weights / g:.2f} GB (tensor parallel {self.tensor})",
                f"  - activations {self.activations / g:.2f} GB (estimate, from shapes) - graph pool {self.graph_pool / g:.2f} GB (estimate)",
                f"  = KV {self.kv_tokens * self.kv_bytes_per_token / g:.2f} GB / {self.kv_bytes_per_token:,.0f} B per token per rank "
                f"= {self.kv_tokens:,} tokens",
                *(f"  source, {k}: {v}" for k, v in self.sources.items())]


def shard(m: ModelShape, tensor: int) -> ModelShape:
    """One rank's share of the model under `tensor`-way parallelism (KV heads replicated below one per rank)."""
    if tensor <= 1:
        return m
    for name, n in (("attention heads", m.heads), ("intermediate size", m.intermediate)):
        if n % tensor:
            raise ValueError(f"tensor parallel {tensor} does not divide the model's {name} ({n})")
    return replace(m, heads=m.heads // tensor, kv_heads=max(1, m.kv_heads // tensor),
                   intermediate=m.intermediate // tensor, vocab=-(-m.vocab // tensor))


def activation_bytes(m: ModelShape, tokens: int, rows: int) -> float:
    """One step's largest live set at `tokens` new tokens and `rows` logit rows (one rank's shapes)."""
    e, h, kv = DTYPE_BYTES.get(m.dtype, 2), m.hidden, m.kv_heads * m.head_dim
    return max(e, 2) * (tokens * (h + 3 * m.intermediate) + tokens * (m.heads * m.head_dim + 2 * kv)) + 4 * rows * m.vocab


def size(profile: Profile, m: ModelShape, tensor: int = 1, utilization: float | None = None,
         max_num_batched_tokens: int = 8192, max_num_seqs: int = 256) -> Sizing:
    """KV tokens one replica of `tensor` GPUs of this profile holds (ValueError when nothing is left)."""
    if not profile.memory_gb:
        raise ValueError(f"profile {profile.name}: no memory_gb, so it cannot size a KV cache")
    rank = shard(m, tensor)
    u = VLLM_UTILIZATION if utilization is None else utilization
    device = profile.memory_gb * 1e9
    weights = rank.weight_bytes + rank.vocab * rank.hidden * DTYPE_BYTES[m.dtype]  # + the embedding (untied)
    act = activation_bytes(rank, max_num_batched_tokens, max_num_seqs)
    left = device * u - weights - act - GRAPH_POOL_BYTES
    if left <= 0:
        raise ValueError(f"{profile.name} x {tensor}: the weights ({weights / 1e9:.1f} GB per rank) and activations "
                         f"leave no KV cache at utilization {u}")
    src = dict(profile.sources) if profile.sources else {}
    src["utilization"] = "the config's gpu_memory_utilization" if utilization is not None else \
        "vLLM 0.32.0's default (vllm/config/cache.py:102, `gpu_memory_utilization: float = Field(default=0.92, ...)`)"
    return Sizing(device, u, weights, act, GRAPH_POOL_BYTES, rank.kv_bytes_per_token,
                  int(left // rank.kv_bytes_per_token), tensor, src)


def allreduce_s(shape: StepShape, m: ModelShape, tensor: int, profile: Profile) -> float:
    """Seconds of a step's all-reduces: 2 per layer, each the step's new tokens x hidden activations."""
    if tensor <= 1:
        return 0.0
    if not profile.link_gbps:
        raise ValueError(f"profile {profile.name}: tensor parallel {tensor} needs link_gbps (the GPU link's bandwidth)")
    tokens = sum(n for n, _, _ in shape.seqs)
    nbytes = tokens * m.hidden * max(DTYPE_BYTES.get(m.dtype, 2), 2)  # activations stay 16-bit under fp8 weights
    one = 2 * (tensor - 1) / tensor * nbytes / (profile.link_gbps * 1e9) + ALLREDUCE_LATENCY_S
    return 2 * m.layers * one


def explain(profile: Profile, m: ModelShape, tensor: int = 1, **kw) -> str:
    """What `inferlab simulate --explain-profile` prints: the sizing and each term of a decode step at 1 and
    64 rows and of a 2,048-token prefill, with the sources."""
    from experiments.simulate.step_model import TERMS, coefficient, features

    s = size(profile, m, tensor, **kw)
    rank = shard(m, tensor)
    out = [f"{profile.label}, tensor parallel {tensor}", *s.lines(), "", "step terms (seconds at the profile's peaks x coefficient):"]
    for label, shape in ((f"decode x1, context 1024", StepShape(((1, 1024, 1),))),
                         (f"decode x64, context 1024", StepShape(tuple((1, 1024, 1) for _ in range(64)))),
                         ("prefill 2048", StepShape(((2048, 2048, 1),)))):
        f = features(shape, rank, profile)
        parts = {k: coefficient(profile.coef, k) * f[k] for k in TERMS}
        parts["all-reduce"] = allreduce_s(shape, m, tensor, profile)
        total = sum(parts.values())
        out.append(f"  {label}: {total * 1e3:.3f} ms = " + ", ".join(
            f"{k} {v * 1e3:.3f} ms ({v / total:.0%})" for k, v in parts.items() if v))
    return "\n".join(out)


def as_dict(s: Sizing) -> dict:
    return asdict(s)
