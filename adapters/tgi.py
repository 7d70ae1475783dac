"""Hugging Face TGI (text-generation-inference): launched or attached; no in-process mode.

Maintenance mode: upstream put TGI in maintenance mode in December 2025 and points users
to vLLM and SGLang. It is kept here so existing deployments can be compared.

- Server: `text-generation-launcher --model-id M --hostname H --port P
  [--max-batch-total-tokens N]`, or its image (`docker run --gpus all ...
  ghcr.io/huggingface/text-generation-inference:TAG`, whose entrypoint is the launcher).
  TGI's `--dtype` knows float16 / bfloat16 only, so a float32 model is launched without it.
- Requests: `/generate_stream` through `huggingface_hub.AsyncInferenceClient`
  (`details=True`, so every event carries its token id). TGI takes text, not ids: the
  prompt is `request.prompt_text`, or the ids decoded with the model's tokenizer.json; the
  engine's own prompt length (`details.input_length`) is reported so the harness can flag
  a re-tokenization mismatch.
- No `ignore_eos`: TGI's router forces it off, so a request may stop before
  max_new_tokens; `EngineInfo.knobs["ignore_eos"] = "unsupported"` tells the report to
  flag those rows.
- KV capacity: `/info`'s `max_batch_total_tokens` when present, else the startup log line
  "Setting max batch total tokens to N". Metrics: `tgi_batch_current_size`, `tgi_queue_size`.
- `abort` takes effect at the request's next event (the stream is closed then; TGI cancels
  a request whose client went away). recv_ns is taken after huggingface_hub parsed the event.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, AsyncIterator

import httpx

from adapters import prom
from adapters.base import (EngineInfo, EngineUnavailable, GenerationRequest, MemorySnapshot,
                           RequestError, TokenEvent)
from adapters.serving import HTTPServerEngine, ModalEngine, need

INSTALL = ("install text-generation-launcher (TGI) on a GPU host, or set launcher = "
           "\"docker run --gpus all --shm-size 1g --network host -v {model}:{model} "
           "ghcr.io/huggingface/text-generation-inference:TAG\"")
KNOBS = ("max_concurrent_requests", "max_batch_prefill_tokens", "max_total_tokens", "max_input_tokens",
         "cuda_memory_fraction", "num_shard", "quantize")
MAX_BATCH_LOG = re.compile(r"Setting max batch total tokens to (\d+)")
FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}


def max_batch_total_tokens(log_text: str) -> int | None:
    """N from TGI's startup line "Setting max batch total tokens to N" (the last one)."""
    found = MAX_BATCH_LOG.findall(log_text)
    return int(found[-1]) if found else None


class TGIEngine(ModalEngine):
    name = "tgi"
    IMPLS = {"server": "adapters.tgi:TGIServer", "attach": "adapters.tgi:TGIServer"}


class TGIServer(HTTPServerEngine):
    name = "tgi"
    OPTIONS = HTTPServerEngine.OPTIONS | set(KNOBS)
    INSTALL = INSTALL

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        self.client: Any = None
        self.http: httpx.AsyncClient | None = None
        self.tokenizer: Any = None

    def server_argv(self) -> list[str]:
        s = self.server
        args: list[str] = ["--model-id", s.model_arg, "--hostname", s.host, "--port", s.port]
        if self.dtype != "float32":
            args += ["--dtype", self.dtype]
        if self.options.get("kv_cache_tokens") is not None:
            args += ["--max-batch-total-tokens", str(int(self.options["kv_cache_tokens"]))]
        for k in KNOBS:
            if self.options.get(k) is not None:
                args += ["--" + k.replace("_", "-"), str(self.options[k])]
        return s.argv(script="text-generation-launcher", args=args, container_cmd=[])

    async def start(self) -> EngineInfo:
        if self.info is not None:
            return self.info
        hub = need("huggingface_hub", "pip install huggingface-hub")
        try:
            base = await self.connect()
            self.http = httpx.AsyncClient(base_url=base, trust_env=False, timeout=30.0)
            info = await self._info(base)
            self.client = hub.AsyncInferenceClient(base_url=base)
            cap = info.get("max_batch_total_tokens")
            if cap is None and self.server is not None:
                cap = max_batch_total_tokens(self.server.log_text())
            knobs = {"url": base, "ignore_eos": "unsupported", "prompt": "text",
                     **{k: self.options[k] for k in (*KNOBS, "kv_cache_tokens") if k in self.options}}
            self.info = EngineInfo(engine=self.name, version=str(info.get("version", "unknown")),
                                   model=str(info.get("model_id", self.model)), dtype=self.dtype,
                                   kv_capacity_tokens=cap, knobs=knobs, mode=self.mode, pid=self.pid)
        except BaseException:
            await self.stop()
            raise
        return self.info

    async def _info(self, base: str) -> dict[str, Any]:
        """GET /info ({} when the server has none: version and capacity stay unknown)."""
        try:
            resp = await self.http.get("/info")
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"no TGI server answers at {base} ({e!r})") from e
        try:
            return resp.json() if resp.status_code == 200 else {}
        except ValueError:
            return {}

    def _prompt(self, request: GenerationRequest) -> str:
        if request.prompt_text is not None:
            return request.prompt_text
        if self.tokenizer is None:
            from tokenizers import Tokenizer

            path = Path(self.model) / "tokenizer.json"
            if not path.is_file():
                raise ValueError(f"engine 'tgi' takes text: request {request.request_id} has no prompt_text "
                                 f"and {path} does not exist to decode its ids")
            self.tokenizer = Tokenizer.from_file(str(path))
        return self.tokenizer.decode(list(request.prompt_token_ids), skip_special_tokens=False)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self.client is None:
            raise RuntimeError("engine 'tgi': call start() before generate()")
        s, rid = request.sampling, request.request_id
        greedy = s.temperature == 0
        try:
            stream = await self.client.text_generation(
                self._prompt(request), max_new_tokens=s.max_tokens, details=True, stream=True,
                do_sample=not greedy, temperature=None if greedy else s.temperature,
                top_p=s.top_p if 0 < s.top_p < 1 else None, top_k=s.top_k if s.top_k and s.top_k > 0 else None,
                seed=s.seed, stop=list(s.stop) or None)
        except Exception as e:  # huggingface_hub raises its own HTTP error types
            raise RequestError(f"request {rid}: TGI refused it: {e}") from e
        try:
            async for out in stream:
                recv_ns = time.perf_counter_ns()
                tok = out.token
                ids, text = ([tok.id], tok.text) if tok is not None else ([], "")
                d = out.details
                if d is not None or out.generated_text is not None:
                    reason = FINISH.get(str(getattr(d, "finish_reason", "")), getattr(d, "finish_reason", None))
                    yield TokenEvent(rid, ids, text, recv_ns, True, reason, getattr(d, "input_length", None),
                                     getattr(d, "generated_tokens", None))
                    return
                yield TokenEvent(rid, ids, text, recv_ns)
                if rid in self._aborted:
                    yield TokenEvent(rid, [], recv_ns=time.perf_counter_ns(), finished=True, finish_reason="abort")
                    return
        finally:
            self._aborted.discard(rid)
            await stream.aclose()
        raise RequestError(f"request {rid}: TGI stream ended without a final event")

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def snapshot(self) -> MemorySnapshot:
        snap = MemorySnapshot(t_ns=time.perf_counter_ns(), kv_capacity_tokens=self.info.kv_capacity_tokens
                              if self.info else None)
        m = await prom.scrape(self.http, "/metrics") if self.http is not None else None
        if m is not None:
            running, waiting = m.value("tgi_batch_current_size"), m.value("tgi_queue_size")
            snap.num_running = int(running) if running is not None else None
            snap.num_waiting = int(waiting) if waiting is not None else None
        return snap

    async def close_clients(self) -> None:
        http, self.http, self.client = self.http, None, None
        if http is not None:
            await http.aclose()
