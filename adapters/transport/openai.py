"""Any OpenAI-compatible `/v1/completions` server, streamed over SSE with one shared httpx client.

Attach mode is this class itself (`options.url`; registered as engine "openai" by adapters/engines/openai).
Server adapters (`inferlab serve`, vLLM, TensorRT-LLM) mix `adapters.transport.server.LaunchedServer` in before
it, which supplies `connect()` (launch a server, return its base URL), `disconnect()`, `pid`, `launch_knobs()`
and `launch_argv`; they may override `token_id_fields()`, `_completion_body()`, `_parse_chunk()`, `_knobs()`,
`_capacity()`, `_read_back()`, `_unhonoured()`, and set `METRICS` (their MetricNames: `path` is where Prometheus
text lives). A request with `messages` goes to `/v1/chat/completions` (its own chat template).
- `EngineInfo.effective` / `.memory` come from `_read_back()`: the KV geometry of the first scrape
  and the launch command, plus what a subclass's engine reports. Options `enable_prefix_caching` /
  `speculative_config` (adapters.common.features): an attached server cannot take them (`unhonoured`).

Invariants:
- `recv_ns` is taken when an SSE line arrives, before it is parsed.
- Token ids per event come from the server (`return_token_ids`, vLLM >= 0.10 and our
  server put the *delta* ids in `choices[0].token_ids`; `token_id_fields()` is what a
  subclass asks with instead). A server that streams only text is asked for running usage
  in every chunk (`stream_options.continuous_usage_stats`), and each event carries as many
  `UNKNOWN_TOKEN_ID`s as `usage.completion_tokens` grew; only when a server sends no such
  usage is one token counted per non-empty text chunk (a guess: an empty chunk may hold a
  token, one chunk several). `EngineInfo.unhonoured["token_ids"]` says which.
- The chunk carrying `finish_reason` is held back (with its own `recv_ns`) until the usage chunk
  or `[DONE]` arrives, so the one finished event also carries the server's token counts.
"""
from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator, NamedTuple

import httpx

from adapters.base import (UNKNOWN_TOKEN_ID, Engine, EngineInfo, EngineUnavailable, GenerationRequest, MemorySnapshot,
                           RequestError, SamplingConfig, TokenEvent, check_options)
from adapters.common import features
from adapters.common.readback import ReadBack, launch_command
from adapters.transport import prom, sse
from adapters.transport.metric_names import VLLM, MetricNames
from adapters.transport.server import aclose_then, kv_pin_gap


class Chunk(NamedTuple):
    token_ids: list[int] | None  # None: the server sent no ids (text-only stream)
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None


class OpenAIEngine(Engine):
    """Options: url (required in attach mode), api_key, served_model_name (default: the
    first of GET /v1/models), token_ids_prompt (default true; false sends
    `request.prompt_text`), return_token_ids (default true), extra_body (merged into every
    request body), metrics_path (default: the METRICS row's path). `kv_cache_tokens` is
    accepted, but an attached server's KV budget was fixed when it started: unless its
    capacity equals the budget, `EngineInfo.unhonoured["kv_cache_tokens"]` says so."""

    name, mode, MODES = "openai", "attach", ("attach",)  # a server adapter's registration renames it
    OPTIONS = frozenset({"url", "api_key", "served_model_name", "token_ids_prompt", "return_token_ids",
                         "extra_body", "metrics_path", "kv_cache_tokens", *features.OPTIONS})
    METRICS: MetricNames = VLLM  # what to read from the Prometheus text (adapters.transport.metric_names)
    KV_HOW = "an already running server (its KV budget was fixed when it started)"  # for unhonoured

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        features.prefix_caching(self.name, self.options)
        features.speculative(self.name, self.options.get("speculative_config"))
        self.base_url: str | None = None
        self.metrics_path: str = self.options.get("metrics_path", self.METRICS.path)
        self.served_model_name: str | None = self.options.get("served_model_name")
        self.token_ids_prompt = bool(self.options.get("token_ids_prompt", True))
        self.events_carry_token_ids: bool | None = None
        self.usage_per_chunk: bool | None = None  # text-only servers: running usage in every chunk
        self.info: EngineInfo | None = None
        self._client: httpx.AsyncClient | None = None
        self._has_metrics = False
        self._first_metrics: prom.Metrics | None = None  # the full scrape at start, for _read_back
        self._model_entry: dict[str, Any] = {}  # the served model's entry of GET /v1/models
        # snapshot() parses only these (see adapters.transport.prom); start() parses everything once
        self._metric_names = self.METRICS.prefixes()
        self._live: set[str] = set()  # requests whose generate() is running
        self._streamer: sse.Streamer | None = None  # the measured path (adapters/transport/sse.py)
        self._responses: dict[str, sse.Stream] = {}
        self._aborted: set[str] = set()

    # -- hooks for server subclasses -------------------------------------------------------

    async def connect(self) -> str:
        """Return the server's base URL (no trailing /v1); LaunchedServer launches one here."""
        url = self.options.get("url")
        if not url:
            raise ValueError(f'engine {self.name!r} needs option url = "http://HOST:PORT" '
                             f"(an OpenAI-compatible server that is already running)")
        return str(url).rstrip("/").removesuffix("/v1")

    async def disconnect(self) -> None:
        """Stop what `connect` started (nothing in attach mode)."""

    @property
    def pid(self) -> int | None:
        return None

    def launch_knobs(self) -> dict[str, Any]:
        return {}

    @property
    def launch_argv(self) -> list[str] | None:
        return None

    def _knobs(self) -> dict[str, Any]:
        return {"url": self.base_url, "token_ids_prompt": self.token_ids_prompt, **self.launch_knobs()}

    def token_id_fields(self) -> dict[str, Any]:
        """Request fields that make the server stream each event's token ids (vLLM's extension)."""
        return {"return_token_ids": True} if self.options.get("return_token_ids", True) else {}

    def _completion_body(self, request: GenerationRequest) -> dict[str, Any]:
        s: SamplingConfig = request.sampling
        if self.token_ids_prompt:
            prompt: Any = list(request.prompt_token_ids)
        elif request.prompt_text is not None:
            prompt = request.prompt_text
        else:
            raise ValueError(f"request {request.request_id}: token_ids_prompt=false needs request.prompt_text")
        body: dict[str, Any] = {
            "model": self.served_model_name, "prompt": prompt, "max_tokens": s.max_tokens,
            "temperature": s.temperature, "top_p": s.top_p,
            "stream": True, "stream_options": {"include_usage": True},
        }
        # Extensions, sent only when they differ from OpenAI's defaults so that strict servers
        # see a plain request.
        body.update(self.token_id_fields())
        if self.events_carry_token_ids is False:  # count tokens from the running usage instead
            body["stream_options"]["continuous_usage_stats"] = True
        if s.top_k not in (None, -1, 0):
            body["top_k"] = s.top_k
        if s.min_p:
            body["min_p"] = s.min_p
        if s.ignore_eos:
            body["ignore_eos"] = True
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = list(s.stop)
        body.update(self.options.get("extra_body") or {})
        if request.messages is not None:  # the engine's own chat route applies its own template
            del body["prompt"]
            body["messages"] = request.messages
        return body

    @staticmethod
    def _count_text_only(obj: dict[str, Any], text: str, usage: dict[str, Any] | None,
                         counted: int) -> tuple[list[int], int]:
        """Placeholder ids for a chunk that carried none, and the tokens counted so far: as many
        as the running usage grew when the chunk has it, else one per non-empty text (a guess)."""
        if not obj.get("choices"):
            return [], counted  # the closing usage chunk: no new tokens
        done = (usage or {}).get("completion_tokens")
        if done is None:
            return ([UNKNOWN_TOKEN_ID] if text else []), counted
        return [UNKNOWN_TOKEN_ID] * max(0, done - counted), max(counted, done)

    def _parse_chunk(self, obj: dict[str, Any]) -> Chunk:
        choices = obj.get("choices") or []
        if not choices:
            return Chunk(None, "", None, obj.get("usage"))
        c = choices[0]
        text = c["text"] if "text" in c else (c.get("delta") or {}).get("content")  # completion | chat chunk
        return Chunk(c.get("token_ids"), text or "", c.get("finish_reason"), obj.get("usage"))

    async def _capacity(self) -> tuple[int | None, int | None]:
        """(KV capacity in tokens, block size) from one full scrape at start (sets `_has_metrics`)."""
        return prom.kv_capacity(await self._scrape(first=True), self.METRICS)

    def _dtype_ran(self) -> str:
        """The dtype the engine runs (subclasses that can read it back override)."""
        return self.dtype

    async def _engine_read_back(self, rb: ReadBack) -> None:
        """Add what this engine reports about itself to `rb` (subclasses; first source wins)."""

    async def _read_back(self, capacity: int | None, block_size: int | None) -> ReadBack:
        """What the engine reports it runs with (EngineInfo.effective / .memory): the engine's
        own reports (`_engine_read_back`), then the KV geometry of the first scrape, the
        `max_model_len` of /v1/models (vLLM and our server list it) and the launch command."""
        rb = ReadBack()
        await self._engine_read_back(rb)
        where = f"{self.METRICS.engine} KV gauges at {self.metrics_path}"
        rb.put("kv_capacity_tokens", capacity, where)
        rb.put("block_size", block_size, where)
        rb.put("max_model_len", self._model_entry.get("max_model_len"), "/v1/models max_model_len")
        rb.put("launch_command", launch_command(self.launch_argv), "the argv this adapter launched")
        return rb

    def _unhonoured(self, capacity: int | None, block_size: int | None) -> dict[str, str]:
        """Fairness settings this engine did not honour, in words (EngineInfo.unhonoured)."""
        out: dict[str, str] = {}
        how = self.KV_HOW if self.mode == "server" else OpenAIEngine.KV_HOW
        gap = kv_pin_gap(self.options.get("kv_cache_tokens"), capacity, block_size, self.name, how)
        if gap:
            out["kv_cache_tokens"] = gap
        if self.events_carry_token_ids is False:
            out["token_ids"] = (f"{self.name}: the stream carries text only, so token ids are unknown (no "
                                f"greedy agreement); tokens per event "
                                + ("come from the server's running usage" if self.usage_per_chunk else
                                   "are guessed, one per non-empty text chunk (the server sends no running usage)"))
        return out

    # -- Engine ------------------------------------------------------------------------------

    async def start(self) -> EngineInfo:
        if self.info is not None:
            return self.info
        try:
            self.base_url = await self.connect()
            headers = {"Authorization": f"Bearer {self.options['api_key']}"} if self.options.get("api_key") else {}
            # read=None: a long generation may sit silent (queued) for minutes; pool=None: under
            # load, requests must not time out waiting for a connection.
            self._client = httpx.AsyncClient(
                base_url=self.base_url, headers=headers, trust_env=False,
                timeout=httpx.Timeout(connect=30.0, read=None, write=60.0, pool=None),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))
            self._streamer = await sse.Streamer(self.base_url, headers).open()
            if self.served_model_name is None:
                self.served_model_name = await self._first_model()
            self.events_carry_token_ids, _ = await self._probe()
            if not self.events_carry_token_ids:  # the next probe asks for running usage
                _, self.usage_per_chunk = await self._probe()
            cap, bs = await self._capacity()
            effective, memory = (await self._read_back(cap, bs)).result()
            unhonoured = self._unhonoured(cap, bs)
            ran = effective.get("dtype") or self._dtype_ran()
            if ran != self.dtype:
                unhonoured.setdefault("dtype", f"{self.name}: {self.dtype} was asked, the server reports dtype {ran}")
            for k, why in features.gaps(self.name, self.options, effective).items():
                unhonoured.setdefault(k, why)
            knobs = {**self._knobs(), "events_carry_token_ids": self.events_carry_token_ids}
            self.info = EngineInfo(engine=self.name, version=await self._version(), model=self.served_model_name,
                                   dtype=ran, kv_capacity_tokens=cap, block_size=bs, knobs=knobs,
                                   mode=self.mode, pid=self.pid,
                                   metrics_url=self.base_url + self.metrics_path if self._has_metrics else None,
                                   unhonoured=unhonoured, effective=effective, memory=memory)
        except httpx.TransportError as e:  # nothing listening, or it hung up
            await self.stop()
            raise EngineUnavailable(f"no OpenAI-compatible server answers at {self.base_url} ({e!r}); "
                                    f"start one (e.g. `inferlab serve MODEL_DIR`) or fix option url") from e
        except BaseException:
            await self.stop()
            raise
        return self.info

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self._client is None:
            raise RuntimeError(f"engine {self.name!r}: call start() before generate()")
        rid = request.request_id
        body = self._completion_body(request)
        held: TokenEvent | None = None  # the finishing chunk, waiting for usage
        usage: dict[str, Any] | None = None
        counted = 0  # text-only streams: completion tokens accounted for so far
        self._live.add(rid)
        try:
            async with self._streamer.post(self.route(request), body) as resp:
                if resp.status_code != 200:
                    raise RequestError(f"request {rid}: HTTP {resp.status_code} from {self.base_url}: "
                                       f"{(await resp.text())[:500]}")
                self._responses[rid] = resp
                try:
                    if rid in self._aborted:  # abort() came while the request was being sent
                        resp.close()
                    async for recv_ns, line in resp.lines():
                        if not line.startswith("data:"):
                            continue  # blank separators, comments, event: lines
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        obj = json.loads(data)
                        if "error" in obj:
                            raise RequestError(f"request {rid}: server error in stream: {obj['error']}")
                        ids, text, finish, chunk_usage = self._parse_chunk(obj)
                        if chunk_usage:
                            usage = chunk_usage
                        if ids is None:
                            ids, counted = self._count_text_only(obj, text, chunk_usage, counted)
                        if finish is not None:
                            held = TokenEvent(rid, ids, text, recv_ns, True, finish, wire=resp.wire)
                        elif ids or text:
                            yield TokenEvent(rid, ids, text, recv_ns, wire=resp.wire)
                except RequestError:
                    raise
                except sse.StreamClosed:  # abort() closed it
                    pass
                except sse.StreamError as e:
                    if rid not in self._aborted:
                        raise RequestError(f"request {rid}: stream from {self.base_url} broke: {e!r}") from e
            if held is None:
                if rid not in self._aborted:
                    raise RequestError(f"request {rid}: stream from {self.base_url} ended without a finish_reason")
                held = TokenEvent(rid, [], recv_ns=time.perf_counter_ns(), finished=True, finish_reason="abort")
            if usage:
                held.prompt_tokens = usage.get("prompt_tokens")
                held.completion_tokens = usage.get("completion_tokens")
            yield held
        finally:
            self._live.discard(rid)
            self._responses.pop(rid, None)
            self._aborted.discard(rid)

    async def abort(self, request_id: str) -> None:
        """Close the request's connection (OpenAI servers abort on disconnect); its stream
        ends with finish_reason "abort". Idempotent; unknown or finished ids are ignored."""
        if request_id not in self._live:
            return
        self._aborted.add(request_id)
        resp = self._responses.get(request_id)
        if resp is not None:
            resp.close()

    async def reset_prefix_cache(self) -> bool:
        """POST /reset_prefix_cache (vLLM needs VLLM_SERVER_DEV_MODE=1 for it)."""
        try:
            return (await self._client.post("/reset_prefix_cache")).status_code == 200
        except httpx.HTTPError:
            return False

    async def snapshot(self) -> MemorySnapshot:
        m = await self._scrape()
        return prom.snapshot(m, self.METRICS, self.info.kv_capacity_tokens if self.info else None)

    async def stop(self) -> None:
        """Close the client, then stop whatever `connect` launched. Idempotent."""
        client, self._client = self._client, None
        streamer, self._streamer = self._streamer, None
        await aclose_then(client, self.disconnect, streamer)

    # -- helpers -----------------------------------------------------------------------------

    async def _first_model(self) -> str:
        resp = await self._client.get("/v1/models")
        if resp.status_code != 200:
            raise EngineUnavailable(f"GET {self.base_url}/v1/models answered {resp.status_code}: {resp.text[:300]}")
        models = resp.json().get("data") or []
        if not models:
            raise EngineUnavailable(f"{self.base_url}/v1/models lists no model; set option served_model_name")
        self._model_entry = models[0]
        return models[0]["id"]

    @staticmethod
    def route(request: GenerationRequest) -> str:
        return "/v1/chat/completions" if request.messages is not None else "/v1/completions"

    def request_body(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        return self.route(request), self._completion_body(request)

    def probe_body(self) -> dict[str, Any]:
        """The start-up probe: one token of "Hello" (text works on every server and vocabulary)."""
        body = self._completion_body(GenerationRequest("inferlab-probe", [0], SamplingConfig(max_tokens=1),
                                                       prompt_text="Hello"))
        return {**body, "prompt": "Hello"}

    async def _probe(self) -> tuple[bool, bool]:
        """Send the probe: did its stream carry token ids, and did every chunk with choices carry
        running usage?"""
        body = self.probe_body()
        carried, usage_every, chunks = False, True, 0
        async with self._client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                raise RequestError(f"probe request to {self.base_url}/v1/completions failed: "
                                   f"HTTP {resp.status_code}: {resp.text[:500]}")
            async for line in resp.aiter_lines():
                data = line[5:].strip() if line.startswith("data:") else ""
                if data and data != "[DONE]":
                    obj = json.loads(data)
                    chunk = self._parse_chunk(obj)
                    carried |= chunk.token_ids is not None
                    if obj.get("choices"):
                        chunks += 1
                        usage_every &= (chunk.usage or {}).get("completion_tokens") is not None
        return carried, usage_every and chunks > 0

    async def _version(self) -> str:
        try:
            resp = await self._client.get("/version")
            if resp.status_code == 200:
                return str(resp.json().get("version", "unknown"))
        except (httpx.HTTPError, ValueError):
            pass
        return "unknown"

    async def _scrape(self, first: bool = False) -> prom.Metrics | None:
        if self._client is None or not (first or self._has_metrics):
            return None
        try:
            m = await prom.scrape(self._client, self.metrics_path, None if first else self._metric_names)
        except httpx.HTTPError:
            return None
        if first:
            self._has_metrics, self._first_metrics = m is not None, m
        return m
