"""The engine: requests in, token deltas out, one `step()` at a time.

`LLMEngine` is the synchronous core: `add_request` validates and queues, `step` runs
schedule -> forward -> sample (or verify drafts, then propose new ones) -> stop checks and
detokenize -> commit (scheduler.update_from_output), and returns one `TokenDelta` per
request that produced tokens (or finished) in that step; a delta may carry several tokens. `LLM` is the offline
batch API on top of it; `AsyncEngine` (async_engine.py) drives the same core from asyncio.

Invariant: a request leaves the engine (blocks freed) in the same step it finishes,
and its last delta has `finished=True`.
"""
from __future__ import annotations

import itertools
import json
import time
import weakref
from pathlib import Path

import torch

from reference_engine.config import EngineConfig, ModelConfig
from reference_engine.worker import paths
from reference_engine.worker.model_runner import ModelRunner
from reference_engine.engine.input_processor import InputProcessor
from reference_engine.engine.messages import EngineStats
from reference_engine.engine.output_processor import OutputProcessor
from reference_engine.outputs import CompletionOutput, TokenDelta
from reference_engine.core.request import Request
from reference_engine.sampling_params import SamplingParams
from reference_engine.core.scheduler import Scheduler
from reference_engine.engine.step_log import StepLog
from reference_engine.worker.step_record import StepRecord, shared
from reference_engine.tokenizer.tokenizer import Tokenizer


class LLMEngine:
    def __init__(self, cfg: EngineConfig, keep_results: bool = False):
        """Raises ValueError, before loading anything, for a config or kernel setting that cannot hold, and
        on CPU for a model and KV budget that would not fit in the memory available (`worker/memory_plan.py`)."""
        ModelConfig.from_dir(cfg.model)  # fail fast, naming the problem, before loading anything
        if problems := paths.problems(cfg):
            raise ValueError("; ".join(problems))
        self.step_log = StepLog(cfg.step_log) if cfg.step_log else None  # a path it cannot write fails now
        self.tokenizer = Tokenizer(cfg.model)
        self.runner = ModelRunner(cfg)
        # the tensor-parallel workers stop when the engine is dropped, not at interpreter exit; the
        # finalizer holds the runner, never the engine (no cycle keeps the engine alive)
        self._finalizer = weakref.finalize(self, self.runner.close)
        self.cfg = cfg = self.runner.cfg  # with the backends the runner chose for the device
        self.model_config = self.runner.model_config
        self.max_model_len = self.runner.max_model_len
        self.processor = InputProcessor.of(cfg, self.model_config.vocab_size, self.max_model_len,
                                           self.runner.kv_capacity_tokens)
        # The runner sized the KV tensors; the scheduler builds the KV-cache manager over their blocks.
        self.scheduler = Scheduler(cfg, self.runner.num_blocks, self.runner.num_lookahead)
        self.requests: dict[str, Request] = {}
        self.outputs = OutputProcessor(self.tokenizer, _eos_ids(cfg.model, self.model_config, self.tokenizer),
                                       self.max_model_len, keep_results=keep_results)
        self.step_records: list[StepRecord] | None = [] if cfg.record_steps else None
        self._ids = itertools.count()
        self._steps = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_requests_finished = 0
        k = self.runner.num_spec_tokens
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * k

    # ---- requests -------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams,
                    request_id: str | None = None, arrival_time: float | None = None,
                    cache_salt: str | None = None) -> str:
        """Validate and queue a request. `cache_salt`: only requests with the same salt share prefix-cache
        blocks."""
        prompt_token_ids = list(prompt_token_ids)
        self.processor.validate(prompt_token_ids, params)
        return self.enqueue(prompt_token_ids, params, request_id, arrival_time, cache_salt)

    def enqueue(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                arrival_time: float | None = None, cache_salt: str | None = None) -> str:
        """Queue a request that an `InputProcessor` has accepted (the boundary validated it: `add_request`,
        `LLM.generate`'s all-or-nothing check, or a front end's `add_request` on the event loop)."""
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        req = Request(request_id, prompt_token_ids, params, arrival_time=arrival_time or time.monotonic(),
                      cache_salt=cache_salt)
        if params.min_tokens:  # vLLM bans EOS (even with ignore_eos) and the stop ids until then
            req.stop_ids = sorted(self.outputs.eos_ids | set(params.stop_token_ids))
        if params.seed is not None:
            req.generator = torch.Generator(device=self.runner.device).manual_seed(params.seed)
        self.requests[request_id] = req
        self.outputs.add(req)
        self.scheduler.add(req)
        return request_id

    def abort(self, request_id: str) -> TokenDelta | None:
        req = self.requests.get(request_id)
        if req is None:
            return None
        req.finish("abort")
        self._release(req)
        return self.outputs.process(req, None, None)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget all cached blocks (True), or fail while requests hold blocks (False), as vLLM does;
        with `reset_running_requests`, running requests are preempted first (they recompute)."""
        return self.scheduler.reset_prefix_cache(reset_running_requests)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def failure(self) -> str | None:
        """Why this engine can no longer step (a tensor-parallel rank died), or None while it can."""
        return self.runner.tp.failure if self.runner.tp else None

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (idempotent; the engine cannot step afterwards).
        Dropping the last reference does the same."""
        self._finalizer()  # runs runner.close once; later calls do nothing

    # ---- the step -------------------------------------------------------------------
    def step(self) -> list[TokenDelta]:
        t0, start = time.perf_counter(), time.monotonic()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return []
        kinds = [(r.request_id, n, s.kind) for (r, n), s in zip(sched.scheduled, sched.seqs)]
        out = self.runner.run(sched.seqs)
        # read before a finished request's blocks are freed; only for a record or a log
        shared_kv = shared([r.block_table for r, _ in sched.scheduled], self.cfg.block_size) \
            if self.step_records is not None or self.step_log else 0
        deltas = []
        now = time.monotonic()
        for req, toks, lps in zip(out.reqs, out.token_ids, out.logprobs):
            if req.first_token_time is None:  # prompt counted once its prefill is done (as vLLM does)
                req.first_token_time = now
                self.prompt_tokens_total += req.num_prompt_tokens
            before = len(req.output_token_ids)
            deltas.append(self.outputs.process(req, toks, lps))  # appends; may finish req (stop / length)
            self.generation_tokens_total += len(req.output_token_ids) - before
        self._count_spec(sched, out.num_accepted)
        finished = self.scheduler.update_from_output(sched, out.num_accepted, out.drafts)
        for req in finished:
            self._forget(req)
        self._steps += 1
        if self.step_records is not None:
            self._record(kinds, sched, out, [r.request_id for r in finished], time.perf_counter() - t0, shared_kv)
        if self.step_log:
            self.step_log.write(self._steps, start, time.perf_counter() - t0, kinds, sched, out,
                                [r.request_id for r in finished], shared_kv)
        return deltas

    def _count_spec(self, sched, num_accepted: dict[str, int]) -> None:
        for rid, drafts in sched.spec_tokens.items():
            a = num_accepted.get(rid, 0)
            self.num_drafts += 1
            self.num_draft_tokens += len(drafts)
            self.num_accepted_tokens += a
            for pos in range(a):
                self.accepted_per_pos[pos] += 1

    def _release(self, req: Request) -> None:
        self.scheduler.finish(req)
        self._forget(req)

    def _forget(self, req: Request) -> None:
        self.requests.pop(req.request_id, None)
        self.num_requests_finished += 1

    def _record(self, kinds, sched, out, finished, dt, shared_kv: int) -> None:
        kv = self.scheduler.stats()
        bs = kv.block_size
        n, b = sched.num_tokens, len(sched.scheduled)
        rows = sum(1 + len(sched.spec_tokens.get(r.request_id, ())) for r in out.reqs)
        tokens = {k: sum(t for _, t, kind in kinds if kind == k) for k in ("prefill", "decode", "verify")}
        self.step_records.append(StepRecord(
            step=self._steps, duration_s=dt, scheduled=kinds,
            num_prefill_tokens=tokens["prefill"], num_decode_tokens=tokens["decode"],
            num_verify_tokens=tokens["verify"],
            preempted=[r.request_id for r in sched.preempted], finished=finished,
            kv_blocks_used=kv.kv_used_blocks, kv_blocks_free=kv.kv_free_blocks, kv_blocks_cached=kv.kv_cached_blocks,
            num_running=kv.num_running, num_waiting=kv.num_waiting,
            block_tables={r.request_id: list(r.block_table) for r in self.scheduler.running},
            prefix_hits=dict(sched.prefix_hits),
            prefix_hit_blocks={r.request_id: r.num_cached_tokens // bs for r in self.scheduler.running},
            prefix_cache_queries=sched.prefix_cache_queries, prefix_cache_hits=sched.prefix_cache_hits,
            shared_kv_tokens=shared_kv,
            spec_proposed={rid: len(d) for rid, d in sched.spec_tokens.items()},
            spec_accepted={rid: out.num_accepted.get(rid, 0) for rid in sched.spec_tokens},
            new_tokens={r.request_id: len(t) for r, t in zip(out.reqs, out.token_ids)},
            spec_tokens={rid: list(d) for rid, d in sched.spec_tokens.items()},
            input_shapes={"input_ids": (n,), "positions": (n,), "slot_mapping": (n,),
                          "block_tables": (b, out.block_table_width),
                          "seq_lens": (b,), "logits": (rows, self.model_config.vocab_size)},
            cuda_graph_bucket=out.graph_bucket, allreduces=out.allreduces,
        ))

    # ---- what ran, and its memory (adapters copy these into EngineInfo) --------------
    def effective_config(self) -> dict:
        """The settings this engine runs with, read back from its parts (not from what was asked):
        the keys of the harness's `EngineInfo.effective`, plus attention_backend, device, linear_backend,
        fused_ops, linear_compute_dtype (the GEMMs' dtype: "float32" for bf16 weights on a CPU without bf16 math),
        linear_kernel (who multiplies the projections of this dtype, every row count: "inferlab", the C++ GEMM on the one
        resident copy, or "onednn"; `packed_linear.linear_kernel`, fp32 and bf16 alike),
        kv_cache_dtype, num_threads (torch intra-op threads), weights_layouts ({layout name: bytes} held beside
        the parameters, `packed_linear.layout_bytes`) and bytes_per_weight (everything held for weights, the
        parameters as held plus every layout, over the number of weights as loaded; tied weights count once); huge_pages
        (CPU: bytes of the panels' and KV cache's mappings, advised for and resident on 2 MiB pages); paths
        (`worker/paths.settings`: the ISA, the linear kernel, the one-call decode layer and its row limit or why it
        is off, CUDA graph sizes, every pin that changes a path)."""
        cfg, kv = self.cfg, self.scheduler.stats()
        return {
            **self.runner.settings(),  # dtype, device, KV capacity, kernels, layouts, paths: what the runner built
            "kv_blocks": kv.kv_total_blocks, "block_size": kv.block_size, "prefix_caching": kv.prefix_caching,
            "max_num_seqs": cfg.max_num_seqs, "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "max_model_len": self.max_model_len, "chunked_prefill": cfg.enable_chunked_prefill, "compile": False,
            "speculative": dict(cfg.speculative_config) if cfg.speculative_config else None,
            "pipeline_parallel_size": 1, "data_parallel_size": 1,
            "attention_backend": cfg.attention_backend, "linear_backend": cfg.linear_backend,
            "fused_ops": cfg.fused_ops,
        }

    def explain_paths(self) -> str:
        """The dispatch table of this engine (`worker/paths.render`): which path runs each step shape, and why."""
        return paths.render(self.runner)

    def release_idle_memory(self) -> None:
        """An idle core hands the free pages of its heap back (CPU; `ModelRunner.release_idle_memory`)."""
        self.runner.release_idle_memory()

    def memory_report(self) -> dict[str, int]:
        """Bytes, the keys of the harness's `EngineInfo.memory` where known: weights, kv_allocated,
        kv_bytes_per_token, kv_peak_used (blocks held at the peak since start or `reset_kv_peak`)
        everywhere; layout_<name> per weight layout, runtime_base (RSS before weights) and activation_peak
        (RSS high-water of the profile forward at start) on CPU; on CUDA activation_peak (profile forward
        at start, torch's allocator), graph_pool, device_total,
        device_free, torch_allocated / torch_reserved / torch_peak_allocated, and from NVML (nvidia-ml-py)
        device_used and process_used. Keys that cannot be measured are absent."""
        m = self.runner.memory()
        kv = self.scheduler.stats()
        m["kv_peak_used"] = kv.kv_peak_blocks * kv.block_size * self.runner.kv_bytes_per_token
        return m

    def reset_kv_peak(self) -> None:
        self.scheduler.reset_kv_peak()

    def stats(self) -> EngineStats:
        kv = self.scheduler.stats()
        return EngineStats(
            num_running=kv.num_running, num_waiting=kv.num_waiting,
            kv_used_blocks=kv.kv_used_blocks, kv_total_blocks=kv.kv_total_blocks,
            kv_usage=kv.kv_used_blocks / kv.kv_total_blocks, kv_capacity_tokens=self.runner.kv_capacity_tokens,
            block_size=kv.block_size, num_preemptions_total=kv.num_preemptions,
            prompt_tokens_total=self.prompt_tokens_total, generation_tokens_total=self.generation_tokens_total,
            num_requests_finished=self.num_requests_finished,
            prefix_cache_queries=kv.prefix_cache_queries, prefix_cache_hits=kv.prefix_cache_hits,
            kv_cached_blocks=kv.kv_cached_blocks,
            spec_decode_num_drafts=self.num_drafts, spec_decode_num_draft_tokens=self.num_draft_tokens,
            spec_decode_num_accepted_tokens=self.num_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos=list(self.accepted_per_pos),
            request_queue_time_s=kv.queue_time_s, request_queue_count=kv.num_first_scheduled,
            **self._tp_counters(),
        )

    def _tp_counters(self) -> dict:
        tp = self.runner.tp
        if tp is None:
            return {}
        d = tp.decode
        return {"tp_decode_steps": d.steps, "tp_decode_seconds": d.seconds,
                "tp_decode_allreduce_seconds": d.allreduce_seconds, "tp_decode_allreduce_bytes": d.allreduce_bytes}


def _eos_ids(model_dir: str, model_config, tokenizer: Tokenizer) -> set[int]:
    ids = set(model_config.eos_token_ids)
    gen = Path(model_dir) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids |= {eos} if isinstance(eos, int) else set(eos or [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class LLM:
    """Offline batches: `LLM(model_dir).generate(prompts, sampling)` -> completions in prompt order.
    With `tensor_parallel_size` > 1 the worker processes stop at `close()`, at the end of a `with LLM(...)
    as llm:` block, or when the last reference to the LLM is dropped (as vLLM's `LLM`)."""

    def __init__(self, model: str, **kwargs):
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs), keep_results=True)
        self.tokenizer = self.engine.tokenizer

    def close(self) -> None:
        """Stop the tensor-parallel workers (idempotent; the LLM cannot generate afterwards)."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(self, prompts: list[str] | list[list[int]] | str,
                 sampling: SamplingParams | list[SamplingParams] | None = None) -> list[CompletionOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt given bare
        sampling = sampling or SamplingParams()
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        for i, p in zip(ids, params):  # all or nothing: reject the batch before queueing any of it
            self.engine.processor.validate(i, p)
        rids = [self.engine.enqueue(i, p) for i, p in zip(ids, params)]
        results: dict[str, CompletionOutput] = {}
        while self.engine.has_unfinished():
            for d in self.engine.step():
                if d.finished:
                    results[d.request_id] = self.engine.outputs.results.pop(d.request_id)
        return [results[r] for r in rids]
