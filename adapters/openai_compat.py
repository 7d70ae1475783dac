"""Any OpenAI-compatible `/v1/completions` server, streamed over SSE with one shared httpx client.

Attach mode is this class itself (`options.url`). Server adapters (the reference
engine's `inferlab serve`, vLLM, TensorRT-LLM) subclass it and override the hooks:
`_connect()` (launch a server, return its base URL), `_disconnect()` (stop it), `_pid()`,
`_completion_body()`, `_parse_chunk()`, `_knobs()`, `_kv_capacity()` (given the whole
/metrics scrape, once at start), `_snapshot_from()` (given only the samples named in
`METRICS`, every snapshot), and `METRICS` / `metrics_path` for servers whose names differ.

Invariants:
- `recv_ns` is taken when an SSE line arrives, before it is parsed.
- Token ids per event come from the server (`return_token_ids`, vLLM >= 0.10 and our
  server put the *delta* ids in `choices[0].token_ids`); a server that streams only text
  gets one `UNKNOWN_TOKEN_ID` per non-empty chunk, and `events_carry_token_ids=False`
  in `EngineInfo.knobs` says so.
- The chunk carrying `finish_reason` is held back (with its own `recv_ns`) until the
  usage chunk or `[DONE]` arrives, so the one finished event also carries the
  server's prompt/completion token counts.
"""
from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator, NamedTuple

import httpx

from adapters import prom
from adapters.base import (UNKNOWN_TOKEN_ID, Engine, EngineInfo, EngineUnavailable, GenerationRequest,
                           MemorySnapshot, RequestError, SamplingConfig, TokenEvent, check_options)


class Chunk(NamedTuple):
    token_ids: list[int] | None  # None: the server sent no ids (text-only stream)
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None


class OpenAIEngine(Engine):
    """Options: url (required in attach mode), api_key, served_model_name (default: the
    first of GET /v1/models), token_ids_prompt (default true; false sends
    `request.prompt_text`), return_token_ids (default true), extra_body (merged into every
    request body), metrics_path (default /metrics). `kv_cache_tokens` is accepted and
    ignored: an attached server's KV budget was fixed when it started."""

    name = "openai"
    mode = "attach"
    OPTIONS = frozenset({"url", "api_key", "served_model_name", "token_ids_prompt", "return_token_ids",
                         "extra_body", "metrics_path", "kv_cache_tokens"})
    # What to read from /metrics (first name present wins); vLLM's names.
    METRICS = {
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "cache_info": ("vllm:cache_config_info",),
    }

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        self.base_url: str | None = None
        self.metrics_path: str = self.options.get("metrics_path", "/metrics")
        self.served_model_name: str | None = self.options.get("served_model_name")
        self.token_ids_prompt = bool(self.options.get("token_ids_prompt", True))
        self.events_carry_token_ids: bool | None = None
        self.info: EngineInfo | None = None
        self._client: httpx.AsyncClient | None = None
        self._has_metrics = False
        # snapshot() parses only these (see adapters.prom); start() parses everything once
        self._metric_names = tuple(n for names in self.METRICS.values() for n in names)
        self._live: set[str] = set()  # requests whose generate() is running
        self._responses: dict[str, httpx.Response] = {}
        self._aborted: set[str] = set()

    # -- hooks for server subclasses -------------------------------------------------------

    async def _connect(self) -> str:
        """Return the server's base URL (no trailing /v1). Subclasses launch their server here."""
        url = self.options.get("url")
        if not url:
            raise ValueError(f'engine {self.name!r} needs option url = "http://HOST:PORT" '
                             f"(an OpenAI-compatible server that is already running)")
        return str(url).rstrip("/").removesuffix("/v1")

    async def _disconnect(self) -> None:
        """Stop what `_connect` started (nothing in attach mode)."""

    def _pid(self) -> int | None:
        return None

    def _knobs(self) -> dict[str, Any]:
        return {"url": self.base_url, "token_ids_prompt": self.token_ids_prompt}

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
        # vLLM's extensions, sent only when they differ from OpenAI's defaults so that
        # strict servers see a plain request.
        if self.options.get("return_token_ids", True):
            body["return_token_ids"] = True
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
        return body

    def _parse_chunk(self, obj: dict[str, Any]) -> Chunk:
        choices = obj.get("choices") or []
        if not choices:
            return Chunk(None, "", None, obj.get("usage"))
        c = choices[0]
        return Chunk(c.get("token_ids"), c.get("text") or "", c.get("finish_reason"), obj.get("usage"))

    def _kv_capacity(self, m: prom.Metrics | None) -> tuple[int | None, int | None]:
        """(KV capacity in tokens, block size) from vLLM's cache_config_info labels."""
        labels = m.labels(*self.METRICS["cache_info"]) if m else None
        if not labels:
            return None, None
        blocks, bs = prom.as_int(labels.get("num_gpu_blocks")), prom.as_int(labels.get("block_size"))
        return (blocks * bs if blocks is not None and bs else None), bs

    def _snapshot_from(self, m: prom.Metrics, snap: MemorySnapshot) -> MemorySnapshot:
        usage = m.value(*self.METRICS["kv_usage"])
        running, waiting = m.value(*self.METRICS["running"]), m.value(*self.METRICS["waiting"])
        cap = self.info.kv_capacity_tokens if self.info else None
        snap.kv_usage = usage
        snap.kv_capacity_tokens = cap
        snap.kv_used_tokens = round(usage * cap) if usage is not None and cap else None
        snap.num_running = int(running) if running is not None else None
        snap.num_waiting = int(waiting) if waiting is not None else None
        return snap

    # -- Engine ------------------------------------------------------------------------------

    async def start(self) -> EngineInfo:
        if self.info is not None:
            return self.info
        try:
            self.base_url = await self._connect()
            headers = {"Authorization": f"Bearer {self.options['api_key']}"} if self.options.get("api_key") else {}
            # read=None: a long generation may sit silent (queued) for minutes; pool=None: under
            # load, requests must not time out waiting for a connection.
            self._client = httpx.AsyncClient(
                base_url=self.base_url, headers=headers, trust_env=False,
                timeout=httpx.Timeout(connect=30.0, read=None, write=60.0, pool=None),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))
            if self.served_model_name is None:
                self.served_model_name = await self._first_model()
            self.events_carry_token_ids = await self._probe()
            metrics = await self._scrape(first=True)
            cap, bs = self._kv_capacity(metrics)
            knobs = {**self._knobs(), "events_carry_token_ids": self.events_carry_token_ids}
            self.info = EngineInfo(engine=self.name, version=await self._version(), model=self.served_model_name,
                                   dtype=self.dtype, kv_capacity_tokens=cap, block_size=bs, knobs=knobs,
                                   mode=self.mode, pid=self._pid(),
                                   metrics_url=self.base_url + self.metrics_path if self._has_metrics else None)
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
        self._live.add(rid)
        try:
            async with self._client.stream("POST", "/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise RequestError(f"request {rid}: HTTP {resp.status_code} from {self.base_url}: "
                                       f"{resp.text[:500]}")
                self._responses[rid] = resp
                try:
                    if rid in self._aborted:  # abort() came while the request was being sent
                        await resp.aclose()
                    async for line in resp.aiter_lines():
                        recv_ns = time.perf_counter_ns()
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
                            ids = [UNKNOWN_TOKEN_ID] if text else []
                        if finish is not None:
                            held = TokenEvent(rid, ids, text, recv_ns, True, finish)
                        elif ids or text:
                            yield TokenEvent(rid, ids, text, recv_ns)
                except RequestError:
                    raise
                except (httpx.HTTPError, RuntimeError, ValueError) as e:  # RuntimeError: closed by abort()
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
            await resp.aclose()

    async def reset_prefix_cache(self) -> bool:
        """POST /reset_prefix_cache (vLLM needs VLLM_SERVER_DEV_MODE=1 for it)."""
        try:
            return (await self._client.post("/reset_prefix_cache")).status_code == 200
        except httpx.HTTPError:
            return False

    async def snapshot(self) -> MemorySnapshot:
        snap = MemorySnapshot(t_ns=time.perf_counter_ns())
        m = await self._scrape()
        return self._snapshot_from(m, snap) if m is not None else snap

    async def stop(self) -> None:
        """Close the client, then stop whatever `_connect` launched. Idempotent."""
        client, self._client = self._client, None
        try:
            if client is not None:
                await client.aclose()
        finally:
            await self._disconnect()

    # -- helpers -----------------------------------------------------------------------------

    async def _first_model(self) -> str:
        resp = await self._client.get("/v1/models")
        if resp.status_code != 200:
            raise EngineUnavailable(f"GET {self.base_url}/v1/models answered {resp.status_code}: {resp.text[:300]}")
        models = resp.json().get("data") or []
        if not models:
            raise EngineUnavailable(f"{self.base_url}/v1/models lists no model; set option served_model_name")
        return models[0]["id"]

    async def _probe(self) -> bool:
        """Send one 1-token request; True if its stream carried token ids."""
        body = self._completion_body(GenerationRequest("inferlab-probe", [0], SamplingConfig(max_tokens=1),
                                                       prompt_text="Hello"))
        body["prompt"] = "Hello"  # text works on every server and any vocabulary
        carried = False
        async with self._client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                raise RequestError(f"probe request to {self.base_url}/v1/completions failed: "
                                   f"HTTP {resp.status_code}: {resp.text[:500]}")
            async for line in resp.aiter_lines():
                data = line[5:].strip() if line.startswith("data:") else ""
                if data and data != "[DONE]":
                    carried |= self._parse_chunk(json.loads(data)).token_ids is not None
        return carried

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
            self._has_metrics = m is not None
        return m
