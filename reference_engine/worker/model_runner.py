"""The model runner: turns one scheduled step into one forward pass and new tokens per request.

A step is flattened into varlen tensors, decodes first, written into persistent buffers
(`input_batch.StepInputs`: nothing is allocated on the device per step). Logits are computed only
for rows that sample: a request whose step reaches the end of its tokens samples at its last row,
and a request with j draft tokens scheduled after them gets j + 1 rows, verified together
(`spec_decode/verifier.py`): it emits its accepted drafts and then one token from the target, so
each request gets a *list* of new tokens. An all-greedy batch is one argmax on the device and one
host sync (the token ids) for the whole step.

On CUDA, decode steps replay a CUDA graph captured per batch-size bucket (`cuda_graphs.py`;
`enforce_eager` turns that off); the attention backend defaults to Triton there.

Start-up is one pass, each step once: the config (backends chosen for the device, `backends.py`); the
memory plan (`memory_plan.py`: weights, layouts, activations, KV, CUDA graph reserve), checked against free
RAM before anything is loaded; the weights (`model/loader.py`, then their layouts); the plan fitted to what
was loaded (CUDA: a profile forward measures the activation peak and, with `gpu_memory_utilization`, the KV
cache gets what is left; CPU: the KV cache is checked once more against free RAM before it is zeroed); the
KV tensors (`kv_cache.py`); the attention backend and step buffers; CUDA graphs. The memory split
(`memory`) and `/server_info` (`settings`) read the plan. On CPU the activation peak is the RSS high-water
above the RSS at the end of start-up (a profile prefill would add seconds to every start; `cpu_heap.py`).

The runner gets the scheduler's per-step record (`core/scheduler_output.ScheduledSeq`: query tokens, first
position, block table, whether it samples, drafts) and derives the slot mapping from the block
tables in its input builder (as vLLM v1's runner does); it never sees the block pool or the
KV-cache manager, and never changes a block table. It sizes and allocates the KV tensors
(`memory_plan.py`, `kv_cache.py`) and tells the scheduler how many blocks they hold. With speculation, the proposer runs
here too, after verification: a draft model writes KV into the same block ids (its own tensors), n-gram
lookup only reads tokens. Device and dtype are explicit (`cfg.device`): one runner drives one device.
With `tensor_parallel_size` N > 1 the runner is rank 0 of N (`distributed/`): it starts the workers,
holds its shard of the weights and KV heads, and broadcasts each step's `(seqs, rows, decodes)` before its own
forward; the workers run the same `forward` on the same record. Only rank 0 samples.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch

from reference_engine.model import fused_ops, packed_linear
from reference_engine.model.fused_decode import FusedDecode
from reference_engine.attention import AttentionMetadata, get_backend
from reference_engine.config import EngineConfig, ModelConfig, default_cuda_graph_sizes
from reference_engine.distributed import group as tp_group, layers as tp_layers
from reference_engine.distributed.sharding import ShardPlan
from reference_engine.worker.cuda_graphs import CudaGraphs, capture_sizes, graphs_wanted
from reference_engine.worker import cpu_heap, paths
from reference_engine.worker.device_memory import DeviceMemory
from reference_engine.worker.input_batch import StepInputs
from reference_engine.worker.kv_cache import allocate_kv_cache
from reference_engine.worker.memory_plan import MemoryPlan
from reference_engine.model.loader import dummy_model, load_model
from reference_engine.outputs import TokenLogprob
from reference_engine.core.request import Request
from reference_engine.worker.sampler import (all_argmax, argmax, banned_ids, logprobs_of, make_batch as sampling_batch,
                                             sample)
from reference_engine.core.scheduler_output import ScheduledSeq
from reference_engine.spec_decode import Draft, make_proposer
from reference_engine.spec_decode.verifier import verify
from reference_engine.worker.backends import with_default_backends


@dataclass
class RunnerOutput:
    reqs: list[Request] = field(default_factory=list)  # the requests that sampled, in row order
    token_ids: list[list[int]] = field(default_factory=list)  # their new tokens (accepted drafts + 1)
    logprobs: list[list[TokenLogprob] | None] = field(default_factory=list)
    num_accepted: dict[str, int] = field(default_factory=dict)  # per request whose drafts were verified
    drafts: dict[str, Draft] = field(default_factory=dict)  # proposals for the next step
    # what the step ran on, for the engine's step record (it never reads the runner's internals)
    block_table_width: int = 0  # columns of the persistent block-table buffer (StepInputs.max_blocks)
    graph_bucket: int | None = None  # the CUDA graph size replayed; None: eager
    allreduces: list[dict] = field(default_factory=list)  # TP with record_steps: rank 0's, in order


class ModelRunner:
    def __init__(self, cfg: EngineConfig, max_model_len: int | None = None, tp: tp_group.Group | None = None):
        """Start-up in one pass: the config; the memory plan (`memory_plan.py`), checked before anything is
        loaded and, on rank 0, before any worker starts; the weights; the KV cache; the attention backend
        and step buffers; CUDA graphs. `tp`: a worker's group (`distributed/worker.py`); rank 0 starts its
        own when the config asks."""
        cfg = self.cfg = with_default_backends(cfg)
        mcfg = ModelConfig.from_dir(cfg.model)
        self.spec = cfg.speculative
        # rank 0 (a worker's rank 0 checked for it): what would not fit RAM fails before loading
        self.plan = MemoryPlan.make(cfg, mcfg, check=tp is None)
        size = cfg.tensor_parallel_size
        if size > 1 and tp is None:
            ShardPlan(mcfg, 0, size)  # a shape that cannot be split fails here, before any process starts
            tp = tp_group.start(cfg)
        self.tp = tp
        try:
            self._build(cfg, mcfg)
        except BaseException:
            if tp is not None and tp.rank == 0:
                tp.close(graceful=False)  # the workers may be inside a collective: no stop message
            raise

    def _build(self, cfg: EngineConfig, mcfg: ModelConfig) -> None:
        tp, plan = self.tp, self.plan
        self.rank = tp.rank if tp else 0
        self.device = tp.device if tp else torch.device(cfg.device)
        self.dtype, self.max_model_len = plan.dtype, plan.max_model_len
        if cfg.num_threads or tp:  # ranks share the cores: cores // N torch threads each by default
            torch.set_num_threads(cfg.num_threads or max(1, (os.cpu_count() or 1) // cfg.tensor_parallel_size))
        cpu = self.device.type == "cpu"
        runtime_base = cpu_heap.prepare() if cpu else None  # the heap policy; RSS before any weight
        self.mem = DeviceMemory(self.device)  # (CUDA: its readings before loading, `mem.start`)
        self.shard = ShardPlan(mcfg, tp.rank, tp.size, tp.all_reduce) if tp else None
        self._load(cfg)
        self.backend_cls = get_backend(cfg.attention_backend)
        # No CUDA graphs with TP: a captured step would have to capture the all-reduces as well.
        self.use_graphs = graphs_wanted(self.device, cfg.enforce_eager, self.backend_cls.graph_safe) and not tp
        kv_cfg = self.shard.kv_config() if self.shard else self.model_config  # this rank's kv heads
        plan.fit(self.model, self.model_config, kv_cfg, self.proposer, self.mem, self.backend_cls, self.use_graphs, tp,
                 runtime_base)
        self.kv_cache = allocate_kv_cache(kv_cfg, plan.num_blocks, cfg.block_size, self.dtype, self.device)
        if self.proposer:
            self.proposer.allocate_kv(plan.num_blocks)
        self.backend = self.backend_cls(self.kv_cache, cfg.block_size)
        # CPU: small all-decode fp32 steps run each layer as one C++ call (fused_decode.py)
        self.fast_decode_refusal = FusedDecode.refusal(self.model, self.backend, tp) if cfg.fused_ops \
            else "fused_ops off"  # why not, in words (worker/paths.py shows it)
        self.fast_decode = FusedDecode(self.model, self.backend) if self.fast_decode_refusal is None else None
        max_blocks = -(-(self.max_model_len + self.num_lookahead) // cfg.block_size)
        self.inputs = StepInputs(cfg.max_num_batched_tokens, cfg.max_num_seqs, max_blocks, cfg.block_size,
                                 self.device, torch.int32 if self.backend_cls.graph_safe else torch.int64)
        self.default_gen = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.graphs: CudaGraphs | None = None
        if self.use_graphs:
            self.capture_graphs()
        self.rss_at_start = cpu_heap.settle() if cpu else None  # CPU: the steps' high-water is measured from here

    def _load(self, cfg: EngineConfig) -> None:
        """The weights (this rank's shard), their layouts and fused ops, and the proposer's model."""
        load = dummy_model if cfg.load_format == "dummy" else load_model
        self.model, self.model_config = load(cfg.model, self.dtype, self.device, self.max_model_len, shard=self.shard)
        self.weight_count = sum(p.numel() for p in self.model.parameters())  # as loaded, before any layout; tied once
        self.linear_compute_dtype = str(self.dtype).removeprefix("torch.")
        if cfg.linear_backend == "onednn":  # CPU: weights prepacked for oneDNN (packed_linear.py)
            packed_linear.pack(self.model)
            tp_layers.pack(self.model)  # the row-parallel layers' own GEMMs (a no-op without TP)
            self.linear_compute_dtype = packed_linear.compute_dtype(self.model)
        # who multiplies fp32 / bf16 projections: "inferlab" (one copy, the panels) or "onednn" (packed_linear.linear_kernel)
        self.linear_kernel = packed_linear.linear_kernel() if cfg.linear_backend == "onednn" \
            and self.dtype in (torch.float32, torch.bfloat16) else cfg.linear_backend
        if cfg.fused_ops:  # CPU: one-pass RMSNorm, rotary and SiLU-and-multiply (fused_ops.py)
            fused_ops.fuse(self.model)
        spec = self.spec
        self.proposer = make_proposer(spec, cfg, self.model_config, self.dtype, self.device,
                                      self.max_model_len) if spec else None
        self.num_spec_tokens = spec.num_speculative_tokens if spec else 0
        self.draft_observes = bool(self.proposer and self.proposer.kv_bytes_per_token)  # a draft model: no graphs

    @property
    def num_blocks(self) -> int:
        return self.plan.num_blocks

    @property
    def kv_bytes_per_token(self) -> int:
        return self.plan.kv_bytes_per_token

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.cfg.block_size

    @property
    def num_lookahead(self) -> int:
        return self.proposer.num_lookahead if self.proposer else 0

    # ---- CUDA graphs ----------------------------------------------------------------
    def capture_graphs(self, eager: bool = False) -> None:
        """Capture decode graphs for every bucket (`eager=True`: `EagerGraph`s, for CPU tests)."""
        cfg = self.cfg
        sizes = default_cuda_graph_sizes() if cfg.cuda_graph_sizes is None else cfg.cuda_graph_sizes
        sizes = capture_sizes(sizes, cfg.max_num_seqs, cfg.max_num_batched_tokens)
        if not sizes:
            return
        self._graph_meta = {b: self._decode_meta(b) for b in sizes}
        self._graph_hidden = torch.zeros(sizes[-1], self.model_config.hidden_size, dtype=self.dtype,
                                         device=self.device)  # every graph's output, outside their pool
        self.inputs.fill([], pad_to=sizes[-1])  # capture over padding: no sequence, every slot -1
        self.graphs = CudaGraphs(self._graph_forward, sizes, self.device, eager=eager)
        free = self.mem.free()
        with torch.inference_mode():
            self.graphs.capture()
        if free is not None:  # the plan's graph_pool: what the capture took
            self.plan.graph_pool = max(0, free - self.mem.free())

    def _decode_meta(self, b: int) -> AttentionMetadata:
        """Bucket b's metadata: views of the step buffers and fixed bounds (the lists are unused)."""
        x = self.inputs
        return AttentionMetadata(
            slot_mapping=x.slot_mapping.dev[:b], block_tables=x.block_tables.dev[:b], seq_lens=x.seq_lens.dev[:b],
            query_lens=[1] * b, seq_lens_list=[self.max_model_len] * b, query_start=list(range(b + 1)),
            num_decodes=b, max_decode_len=self.max_model_len, cu_seqlens_q=x.cu_seqlens_q.dev[:b + 1],
            max_query_len=1, max_seq_len=self.max_model_len,
            num_splits=self.backend.graph_num_splits(b, self.max_model_len))

    def _graph_forward(self, b: int) -> torch.Tensor:
        """What a graph records: the model over the first b rows of the step buffers -> (b, hidden)."""
        self.backend.new_step()  # plan inside the graph, from the buffers, not from a cached step
        x = self.inputs
        hidden = self.model(x.input_ids.dev[:b], x.positions.dev[:b], self.backend, self._graph_meta[b])
        return self._graph_hidden[:b].copy_(hidden)

    def graph_bucket(self, num_seqs: int, rows: list[int], spec: bool, decodes: int) -> int | None:
        """The bucket to replay for this step (every sequence a decode), or None to run it eagerly (cuda_graphs.py)."""
        if self.graphs is None or spec or self.draft_observes or len(rows) != num_seqs or decodes != num_seqs:
            return None
        if not rows or rows[-1] != num_seqs - 1:  # some sequence has more than one query token
            return None
        return self.graphs.bucket(num_seqs)

    # ---- memory ---------------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        """Bytes: the plan's split (`MemoryPlan.split`: weights as held, kv_allocated, kv_bytes_per_token,
        layout_<name>, weights_rank<r> with TP, runtime_base on CPU, activation_peak and graph_pool on CUDA);
        on CPU activation_peak is the RSS high-water since the end of start-up above the RSS then (the largest
        step's activations, kernel caches built on first use, request state, and the harness's growth when it
        shares the process); on CUDA the device's readings now (`DeviceMemory.report`)."""
        out = self.plan.split()
        if "activation_peak" not in out and self.rss_at_start is not None:
            out["activation_peak"] = max(0, cpu_heap.peak_rss() - self.rss_at_start)
        out.update(self.mem.report())
        return out

    def settings(self) -> dict:
        """The runner's part of `LLMEngine.effective_config()`, read back from what it built: dtype (also
        the KV cache's), device, KV capacity, CUDA graphs, tensor parallel size, the GEMMs' compute dtype and
        kernel, torch's intra-op threads, weight layouts ({name: bytes} beside the parameters), bytes per
        weight (everything held for weights over the weights as loaded; tied weights once), huge pages (CPU)
        and the dispatch table's settings (`paths.settings`). Sizes are the memory plan's."""
        layouts = dict(self.plan.layouts)
        dtype = str(self.dtype).removeprefix("torch.")
        return {
            "dtype": dtype, "kv_cache_dtype": dtype, "device": str(self.device),
            "kv_capacity_tokens": self.kv_capacity_tokens, "cuda_graphs": self.graphs is not None,
            "cuda_graph_sizes": list(self.graphs.sizes) if self.graphs is not None else [],
            "tensor_parallel_size": self.tp.size if self.tp else 1,
            "linear_compute_dtype": self.linear_compute_dtype, "linear_kernel": self.linear_kernel,
            "num_threads": torch.get_num_threads(), "weights_layouts": layouts,
            "huge_pages": cpu_heap.huge_pages(self.model, self.kv_cache) if self.device.type == "cpu" else None,
            "paths": paths.settings(self),  # which path runs each step shape, and the inputs that decide it
            "bytes_per_weight": round((self.plan.weights + sum(layouts.values())) / self.weight_count, 3),
        }

    def release_idle_memory(self) -> None:
        """CPU: hand the heap's free pages back (the runner keeps freed memory between steps, so RSS would
        hold the largest batch's activations for good); nothing elsewhere."""
        if self.device.type == "cpu":
            cpu_heap.release_freed_cpu_memory()

    # ---- the step -------------------------------------------------------------------
    def prepare(self, seqs: list[ScheduledSeq]):
        """-> (query tokens, first position, block table) per sequence, decodes first; the logit rows;
        the sequences that sample (their records), their scheduled drafts; the number of decodes
        (`ScheduledSeq.kind`: verify and prefill rows take the prefill path)."""
        order = sorted(seqs, key=lambda s: s.kind != "decode")  # stable: decodes first
        inputs, rows, samplers, drafts = [], [], [], []
        offset = 0
        for s in order:
            inputs.append((s.token_ids, s.start, s.block_table))
            offset += len(s.token_ids)
            if s.samples:  # sample, verifying any drafts
                samplers.append(s)
                drafts.append(s.drafts)
                rows.extend(range(offset - 1 - len(s.drafts), offset))
        return inputs, rows, samplers, drafts, sum(s.kind == "decode" for s in seqs)

    def run(self, step: list[ScheduledSeq]) -> RunnerOutput:
        """One target forward for the whole step (+ the proposer's work with speculation on). With TP,
        a plain decode step's wall time and its all-reduces' time and bytes are counted (`tp.decode`)."""
        if not self.tp:
            return self._run(step)
        ar, t0 = self.tp.all_reduce.stats, time.perf_counter()
        s0, b0 = ar.seconds, ar.bytes
        if self.cfg.record_steps:  # the step record lists this step's all-reduces (engine._record)
            self.tp.all_reduce.log = []
        out = self._run(step)
        out.allreduces = list(self.tp.all_reduce.log or [])
        if all(s.kind == "decode" for s in step):
            self.tp.decode.add(time.perf_counter() - t0, ar.seconds - s0, ar.bytes - b0)
        return out

    @torch.inference_mode()
    def _run(self, step: list[ScheduledSeq]) -> RunnerOutput:
        seqs, rows, sampling, drafts, nd = self.prepare(step)
        samplers = [s.req for s in sampling]  # the sampling rows' params, generators and histories
        spec = any(s.drafts for s in step)
        bucket = self.graph_bucket(len(seqs), rows, spec, nd)
        out = RunnerOutput(reqs=samplers, block_table_width=self.inputs.max_blocks, graph_bucket=bucket)
        if bucket is not None:  # every row samples: the graph's rows are the logit rows
            self.inputs.fill(seqs, pad_to=bucket)
            hidden = self.graphs.replay(bucket, len(seqs))  # (n, hidden)
        else:
            if self.tp:
                self.tp.send_step((seqs, rows, nd))
            batch, hidden = self.forward(seqs, rows, nd)  # (N, hidden)
            if self.proposer:
                self.proposer.observe(batch.input_ids, batch.positions, batch.meta)
            if not samplers:
                return out
            if batch.logit_rows is not None:
                hidden = hidden[batch.logit_rows]
        raw = self.model.logits(hidden)  # (R, V) float32
        if not spec:  # one row per request: the plain sampling path
            ps = [r.params for r in samplers]
            if all_argmax(ps, banned_ids(ps, [r.output_token_ids for r in samplers], [r.stop_ids for r in samplers])):
                # no sampling tensors to build: argmax on the device, one sync
                ids = argmax(raw)
            else:
                sb = sampling_batch(ps, [r.prompt_token_ids for r in samplers],
                                    [r.output_token_ids for r in samplers], [r.generator for r in samplers],
                                    self.device, [r.stop_ids for r in samplers])
                ids = sample(raw, sb, self.default_gen)
            out.token_ids = [[t] for t in ids.tolist()]
            nums = [p.logprobs for p in ps]
            out.logprobs = [None if lp is None else [lp] for lp in logprobs_of(raw, ids, nums)]
        else:
            out.token_ids = verify(raw, samplers, drafts, self.default_gen)
            out.logprobs = self._logprobs(raw, samplers, drafts, out.token_ids)
            out.num_accepted = {r.request_id: len(t) - 1 for r, d, t in zip(samplers, drafts, out.token_ids) if d}
        if self.proposer:
            limits = [self._max_drafts(r, len(t)) for r, t in zip(samplers, out.token_ids)]
            proposals = self.proposer.propose(samplers, [s.block_table for s in sampling], out.token_ids, limits,
                                              self.default_gen)
            out.drafts = {r.request_id: p for r, p in zip(samplers, proposals) if p.token_ids}
        return out

    @torch.inference_mode()
    def forward(self, seqs: list[tuple[list[int], int, list[int]]], rows: list[int], decodes: int):
        """The model over one step's `prepare`d sequences (the first `decodes` of them decodes) -> (batch,
        hidden `(N, hidden)`); on every rank, with the same record. A rank that dies meanwhile raises
        `RankFailure`."""
        batch = self.inputs.fill(seqs, rows, decodes=decodes)
        if self.fast_decode is not None and self.fast_decode.takes(batch):
            return batch, self.fast_decode.forward(batch.input_ids, batch.positions, batch.meta)
        run = lambda: self.model(batch.input_ids, batch.positions, self.backend, batch.meta)  # noqa: E731
        return batch, (self.tp.wrap(run) if self.tp else run())

    def close(self) -> None:
        """Stop the worker ranks (rank 0 with TP; nothing otherwise)."""
        if self.tp is not None and self.rank == 0:
            self.tp.close()

    def _max_drafts(self, req: Request, num_new: int) -> int:
        """Drafts worth proposing: the next step emits at most drafts + 1 tokens, within max_tokens."""
        left = req.num_tokens_left - num_new
        return max(0, min(self.num_spec_tokens, left - 1))

    def _logprobs(self, raw, reqs, drafts, tokens) -> list[list[TokenLogprob] | None]:
        out, row = [], 0
        for r, d, t in zip(reqs, drafts, tokens):
            n = r.params.logprobs
            out.append(None if n is None else
                       logprobs_of(raw[row:row + len(t)], torch.tensor(t, device=raw.device), [n] * len(t)))
            row += len(d) + 1
        return out

