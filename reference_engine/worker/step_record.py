"""Step records: what each engine step did, for tracing and teaching (`inferlab trace`).

Recording is off by default; when off, nothing below is even constructed.
Block counts: `kv_blocks_used` are held by requests, `kv_blocks_free` by nobody (some of them
still cached and reusable until evicted), `kv_blocks_cached` are indexed in the prefix cache
(held or free); `used + free == num_blocks`.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepRecord:
    step: int
    duration_s: float
    scheduled: list[tuple[str, int, str]]  # (request_id, tokens this step incl. drafts, ScheduledSeq.kind)
    num_prefill_tokens: int
    num_decode_tokens: int
    preempted: list[str]
    finished: list[str]
    kv_blocks_used: int
    kv_blocks_free: int
    num_running: int
    num_waiting: int
    block_tables: dict[str, list[int]] = field(default_factory=dict)  # running requests after the step
    kv_blocks_cached: int = 0
    num_verify_tokens: int = 0  # a verify row's tokens: the last generated one and its drafts
    # prefix cache: requests admitted this step -> tokens found cached; per running request, how many
    # leading blocks of its table came from prefix-cache hits (at its latest admission)
    prefix_hits: dict[str, int] = field(default_factory=dict)
    prefix_hit_blocks: dict[str, int] = field(default_factory=dict)
    prefix_cache_queries: int = 0  # tokens looked up this step
    prefix_cache_hits: int = 0  # tokens found
    shared_kv_tokens: int = 0  # context tokens this step's sequences read in blocks another of them reads too (`shared`)
    # speculative decoding: per request whose drafts were verified this step
    spec_proposed: dict[str, int] = field(default_factory=dict)  # draft tokens verified
    spec_accepted: dict[str, int] = field(default_factory=dict)  # of which accepted
    new_tokens: dict[str, int] = field(default_factory=dict)  # tokens each request emitted this step
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)  # the draft ids verified (accepted: a prefix)
    # the step's model inputs as the runner passes them (input_batch.StepInputs): N tokens of B sequences,
    # block tables as rows of the persistent (max_num_seqs, max_blocks) buffer, and the R logit rows that
    # sample (1 + drafts per sampling request). These are the step's own sizes; a decode step replayed
    # from a CUDA graph (CUDA only, cuda_graphs.py) runs padded to `cuda_graph_bucket` rows instead.
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    cuda_graph_bucket: int | None = None  # the captured batch size replayed for this step; None: eager
    # tensor parallelism: rank 0's all-reduces in this step, in order: {"layer", "shape", "bytes", "ms"}
    allreduces: list[dict] = field(default_factory=list)


def shared(tables, block_size: int) -> int:
    """Tokens of KV that the step's sequences read more than once: for each block in more than one of their block
    tables, every read after the first, times the block size. Sequences that share a cached prefix hold the same
    blocks, so a step reads them once from memory and again from the cache (the simulator's step model prices the
    two apart: experiments/simulate/step_model.py)."""
    seen, total = set(), 0
    for t in tables:
        seen.update(t)
        total += len(t)
    return (total - len(seen)) * block_size
