"""The naive baseline: static batches through HF transformers' `model.generate()`.

This is what a user without a serving engine does. Requests that are waiting when the
previous batch finishes form the next batch (up to `max_batch_size`, default 8, and
only requests with the same sampling settings share one), left-padded with an
attention mask; a request that arrives mid-batch waits for the whole batch. There is
no paged KV cache (`kv_capacity_tokens` is None): HF allocates KV per batch.

- Greedy unless `temperature > 0`; `ignore_eos` means "do not stop at EOS" (EOS may still
  be generated), the meaning vLLM and the reference engine give it, so greedy tokens
  agree across engines. (Masking EOS with `min_new_tokens` would change the tokens.)
- `abort` drops the request's events at once, but a static batch cannot shrink: the row
  keeps being computed until every row of its batch is done or aborted.
- Stop strings are not supported (a ValueError says so); events carry no text.
- `EngineInfo.effective` is what this baseline is: the loaded model's parameter dtype, its
  context (`max_position_embeddings`), the batcher's `max_batch_size`, and the features it does
  not have (no paged KV, no prefix cache across requests, no speculation, no chunked prefill, no
  CUDA graphs or compile); `memory.weights` is the model's parameter and buffer bytes. Options
  `enable_prefix_caching = true` and `speculative_config` are accepted and reported unhonoured.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, AsyncIterator

from adapters.base import (Engine, EngineInfo, EngineUnavailable, GenerationRequest, MemorySnapshot, RequestError,
                           TokenEvent, check_options)
from adapters.common import features, runtime_base
from adapters.common.readback import ReadBack
from adapters.engines.hf.stream import Row, make_classes

INSTALL = "pip install 'inferlab[hf]'"
DTYPES = ("float32", "bfloat16", "float16")
NO_PREFIX_CACHE = "the HF baseline keeps no KV cache across requests (each generate() call starts empty)"
NO_SPECULATION = "the HF baseline runs plain generate(); transformers' assisted generation is not used"


def read_back(model: Any, max_batch_size: int, max_len: int | None = None,
              runtime: int | None = None) -> tuple[dict[str, Any], dict[str, int]]:
    """EngineInfo.effective and .memory of the loaded model and this baseline's batcher; `max_len`: the
    adapter's request limit (None: the model's context); `runtime`: this process's RSS before the weights
    loaded (CPU: the memory split's interpreter and libraries)."""
    rb, src = ReadBack(), "the loaded model"
    params = list(model.parameters())
    rb.put("dtype", str(params[0].dtype).removeprefix("torch.") if params else None, src + " (parameter dtype)")
    rb.put("max_model_len", max_len or getattr(model.config, "max_position_embeddings", None), "the adapter's request limit: max_model_len, capped by "
           "model.config.max_position_embeddings")
    rb.put("max_num_seqs", max_batch_size, "the adapter's static batcher (max_batch_size)")
    what_it_is = "HF generate() with static batches (adapters/engines/hf/adapter.py)"
    for key in ("prefix_caching", "speculative", "chunked_prefill", "cuda_graphs", "compile"):
        rb.put(key, False, what_it_is)
    rb.put("paged_kv", False, what_it_is + ": KV allocated per batch, no block pool")
    rb.put("tensor_parallel_size", 1, what_it_is)
    # each storage once: tied weights share one (the baseline needs nothing of the reference engine)
    storages = {(t.device, t.untyped_storage().data_ptr()): t.untyped_storage().nbytes()
                for t in [*model.parameters(), *model.buffers()]}
    rb.mem("weights", sum(storages.values()), "the model's parameter and buffer storages")
    if model.device.type == "cpu":
        rb.mem("runtime_base", runtime, "RSS of the baseline's process before from_pretrained (torch, "
                                        "transformers and the model's class imported, no weight loaded)")
    if model.device.type == "cuda":
        import torch

        rb.mem("device_total", torch.cuda.get_device_properties(model.device).total_memory,
               "torch.cuda.get_device_properties")
    return rb.result()


class HFEngine(Engine):
    # max_model_len: the longest prompt + output a request may have (the harness gives every engine the
    # run's one length; requests beyond it are refused, as vLLM refuses them), capped by the model's context
    OPTIONS = frozenset({"max_batch_size", "device", "attn_implementation", "kv_cache_tokens", "max_model_len",
                         *features.OPTIONS})

    in_process = True  # generate() runs in a thread of this interpreter

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        features.prefix_caching(self.name, self.options)
        features.speculative(self.name, self.options.get("speculative_config"))
        self.max_batch_size = self.options.get("max_batch_size", 8)
        if not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            raise ValueError(f"engine 'hf': max_batch_size must be a positive integer, got {self.max_batch_size!r}")
        if dtype not in DTYPES:
            raise ValueError(f"engine 'hf': dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.info: EngineInfo | None = None
        self._model = None
        self._waiting: deque[Row] = deque()
        self._running: list[Row] = []
        self._rows: dict[str, Row] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._inflight: asyncio.Future | None = None  # the worker thread's current batch

    async def start(self) -> EngineInfo:
        if self.info is not None:
            return self.info
        try:
            import torch
            import transformers
        except ImportError as e:
            raise EngineUnavailable(f"engine 'hf' needs transformers ({e.name} is missing): {INSTALL}") from e
        device = self.options.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        await asyncio.to_thread(self._model_class, transformers)  # its modules are libraries, not weights
        before = runtime_base.rss()  # the process with its libraries, before any weight
        self._model = await asyncio.to_thread(self._load, transformers, getattr(torch, self.dtype), device)
        gc = self._model.generation_config
        eos = gc.eos_token_id
        self._eos = {eos} if isinstance(eos, int) else set(eos or [])
        pad = gc.pad_token_id if gc.pad_token_id is not None else self._model.config.pad_token_id
        self._pad = pad if pad is not None else (min(self._eos) if self._eos else 0)
        # generate() fills unset fields from model.generation_config: clear its EOS so that an
        # ignore_eos batch (which passes none) really does not stop; others pass self._eos.
        gc.eos_token_id = None
        cfg = self._model.config
        self._vocab = cfg.vocab_size
        context = getattr(cfg, "max_position_embeddings", None)
        asked = self.options.get("max_model_len")
        self._max_len = min(x for x in (asked, context) if x) if (asked or context) else None
        self._streamer_cls, self._criteria_cls = make_classes()
        self._task = asyncio.create_task(self._batcher())
        knobs = {"baseline": "naive static batching (HF generate)", "max_batch_size": self.max_batch_size,
                 "device": device, "attn_implementation": cfg._attn_implementation}
        if "kv_cache_tokens" in self.options:
            knobs["kv_cache_tokens"] = "ignored: HF allocates KV per batch"
        effective, memory = read_back(self._model, self.max_batch_size, self._max_len, before)
        # CPU: the RSS high-water from here on is generate()'s: its per-batch KV cache and activations. The
        # parameters may still be unread pages of the mapped checkpoint (an fp32 file loaded as fp32 is not
        # copied): read them once first, so that the first batch's page-ins are not counted as activations.
        if device == "cpu":
            with torch.no_grad():
                for p in self._model.parameters():
                    p.sum()
        self._rss_loaded = runtime_base.rss() if device == "cpu" and runtime_base.reset_peak_rss() else None
        unhonoured = {}
        if self.options.get("enable_prefix_caching"):
            unhonoured["enable_prefix_caching"] = NO_PREFIX_CACHE
        if self.options.get("speculative_config") is not None:
            unhonoured["speculative_config"] = NO_SPECULATION
        self.info = EngineInfo(engine=self.name, version=transformers.__version__, model=self.model,
                               dtype=effective.get("dtype", self.dtype), kv_capacity_tokens=None, block_size=None,
                               knobs=knobs, mode="in_process", pid=None, unhonoured=unhonoured,
                               effective=effective, memory=memory)
        return self.info

    async def memory(self) -> dict[str, int]:
        """CPU: activation_peak, the process's RSS high-water since the model loaded above its RSS then (HF
        allocates its KV cache per batch: it is in this figure, not in kv_allocated)."""
        loaded = getattr(self, "_rss_loaded", None)
        return {} if loaded is None else {"activation_peak": max(0, runtime_base.peak_rss() - loaded)}

    def _model_class(self, transformers):
        """Import the model's class (SmolLM2: modeling_llama and the generation stack, ~165 MiB of modules,
        which `from_pretrained` would import on the way) without loading a weight; None if it cannot be
        resolved (the load then says why)."""
        try:
            cfg = transformers.AutoConfig.from_pretrained(self.model)
            return transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]
        except Exception:  # noqa: BLE001  (an unknown model fails in _load with transformers' own message)
            return None

    def _load(self, transformers, torch_dtype, device):
        from packaging.version import Version

        transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar per start

        # transformers renamed torch_dtype to dtype in 4.56
        key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
        kwargs: dict[str, Any] = {key: torch_dtype}
        if self.options.get("attn_implementation"):
            kwargs["attn_implementation"] = self.options["attn_implementation"]
        model = transformers.AutoModelForCausalLM.from_pretrained(self.model, **kwargs)
        return model.to(device).eval()

    def _check(self, request: GenerationRequest) -> None:
        ids, s = request.prompt_token_ids, request.sampling
        rid = request.request_id
        if not ids:
            raise ValueError(f"request {rid}: empty prompt")
        if min(ids) < 0 or max(ids) >= self._vocab:
            raise ValueError(f"request {rid}: prompt token id out of range [0, {self._vocab})")
        if s.max_tokens < 1:
            raise ValueError(f"request {rid}: max_tokens must be >= 1, got {s.max_tokens}")
        if self._max_len is not None and len(ids) + s.max_tokens > self._max_len:
            raise ValueError(f"request {rid}: prompt ({len(ids)}) + max_tokens ({s.max_tokens}) exceeds the "
                             f"max_model_len ({self._max_len})")
        if s.stop:
            raise ValueError(f"request {rid}: engine 'hf' does not support stop strings")
        if rid in self._rows:
            raise ValueError(f"request {rid}: duplicate request id")

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self._task is None:
            raise RuntimeError("engine 'hf': call start() before generate()")
        self._check(request)
        row = Row(request)
        self._rows[request.request_id] = row
        self._waiting.append(row)
        self._wake.set()
        try:
            while True:
                ev = await row.queue.get()
                if isinstance(ev, BaseException):
                    raise ev
                yield ev
                if ev.finished:
                    return
        finally:
            if not row.closed:  # the consumer left early: stop spending steps on it
                row.aborted = row.closed = True
            self._rows.pop(request.request_id, None)

    async def abort(self, request_id: str) -> None:
        row = self._rows.get(request_id)
        if row is None or row.closed:
            return
        row.aborted = row.closed = True
        while not row.queue.empty():  # events not yet consumed are dropped: abort is the next one
            row.queue.get_nowait()
        row.queue.put_nowait(TokenEvent(request_id, [], "", time.perf_counter_ns(), True, "abort",
                                        len(row.request.prompt_token_ids), row.n_out))

    async def snapshot(self) -> MemorySnapshot:
        snap = MemorySnapshot(t_ns=time.perf_counter_ns(), num_running=len(self._running),
                              num_waiting=len(self._waiting))
        if self._model is not None and self._model.device.type == "cuda":
            import torch

            snap.gpu_bytes = torch.cuda.memory_allocated(self._model.device)
        return snap

    async def stop(self) -> None:
        """Abort everything, let the running batch end (its rows are all aborted, so it stops
        at the next step), and drop the model."""
        for rid in list(self._rows):
            await self.abort(rid)
        self._waiting.clear()
        if self._inflight is not None:  # every row is aborted, so this ends within a step
            await asyncio.gather(self._inflight, return_exceptions=True)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._model = None
        self.info = None

    # -- batching ----------------------------------------------------------------------------

    @staticmethod
    def _key(row: Row) -> tuple:
        s = row.request.sampling  # everything but max_tokens must match within a batch
        return (s.temperature, s.top_p, s.top_k, s.min_p, s.seed, s.ignore_eos)

    def _take_batch(self) -> list[Row]:
        while self._waiting and self._waiting[0].closed:
            self._waiting.popleft()
        if not self._waiting:
            return []
        key = self._key(self._waiting[0])
        batch = [r for r in self._waiting if not r.closed and self._key(r) == key][: self.max_batch_size]
        taken = {id(r) for r in batch}
        self._waiting = deque(r for r in self._waiting if id(r) not in taken and not r.closed)
        return batch

    async def _batcher(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            batch = self._take_batch()
            if not batch:
                continue
            self._running = batch
            try:
                # shield: cancelling this task cannot stop the worker thread; stop() awaits it
                self._inflight = asyncio.ensure_future(asyncio.to_thread(self._run_batch, batch, loop))
                await asyncio.shield(self._inflight)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 — one bad batch fails its requests, not the engine
                err = RequestError(f"engine 'hf': generate() failed: {e!r}")
                self._deliver([(r, err) for r in batch])
            finally:
                self._running, self._inflight = [], None

    def _deliver(self, items: list[tuple[Row, Any]]) -> None:
        """On the event loop: hand events to their rows' queues; drop those of closed rows."""
        for row, ev in items:
            if row.closed:
                continue
            row.queue.put_nowait(ev)
            if isinstance(ev, BaseException) or ev.finished:
                row.closed = True

    def _run_batch(self, batch: list[Row], loop: asyncio.AbstractEventLoop) -> None:
        """Worker thread: one static batch, left-padded, through model.generate()."""
        import torch
        from transformers import GenerationConfig, StoppingCriteriaList

        model = self._model
        s = batch[0].request.sampling
        prompts = [r.request.prompt_token_ids for r in batch]
        T = max(len(p) for p in prompts)
        input_ids = torch.full((len(batch), T), self._pad, dtype=torch.long)  # (B, T), pad on the left
        mask = torch.zeros((len(batch), T), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, T - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, T - len(p):] = 1
        sample = s.temperature > 0
        cfg = GenerationConfig(
            max_new_tokens=max(r.request.sampling.max_tokens for r in batch), do_sample=sample,
            eos_token_id=None if s.ignore_eos else sorted(self._eos) or None, pad_token_id=self._pad,
            **({"temperature": s.temperature, "top_p": s.top_p, "top_k": max(s.top_k, 0),
                "min_p": s.min_p or None} if sample else {}))
        if s.seed is not None:
            torch.manual_seed(s.seed)
        streamer = self._streamer_cls(batch, self._eos, s.ignore_eos, loop, self._deliver)
        stop = StoppingCriteriaList([self._criteria_cls(batch, T)])
        device = model.device
        with torch.inference_mode():
            model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                 generation_config=cfg, streamer=streamer, stopping_criteria=stop)
