"""SGLang: its native server (`python -m sglang.launch_server`) launched or attached, or
`sglang.Engine` in-process.

- Requests go to the native `POST /generate` with `input_ids` (token-exact prompts) and
  `sampling_params {max_new_tokens, temperature, top_p, top_k, min_p, ignore_eos, stop}`,
  `stream: true`; the SSE stream ends with `data: [DONE]`. Each event carries `output_ids`
  and `text` *cumulatively* unless the server runs with `--incremental-streaming-output`
  (read from /server_info at start), so the adapter diffs (adapters/deltas.py).
- `meta_info.finish_reason` is null until the last event, then `{"type": "length"|"stop"|
  "abort", ...}`; `meta_info.prompt_tokens` / `completion_tokens` are the engine's counts.
- KV capacity: `max_total_num_tokens` from `/server_info` (older servers: `/get_server_info`);
  block size = `page_size`. Pinned with `--max-total-tokens`. Usage: `sglang:token_usage`
  at /metrics (the server is started with `--enable-metrics`).
- `reset_prefix_cache` = `POST /flush_cache`; `abort` = `POST /abort_request {"rid"}` and
  closing the connection.
No CPU build installs from PyPI (SGLang's CPU backend needs Intel AMX and a source
build), so on CPU machines this adapter is tested against recorded responses only.
"""
from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator

import httpx

from adapters import prom
from adapters.base import (Engine, EngineInfo, EngineUnavailable, GenerationRequest, MemorySnapshot,
                           RequestError, TokenEvent, check_options)
from adapters.deltas import Cumulative, Incremental, NotCumulative
from adapters.serving import HTTPServerEngine, ModalEngine, need

INSTALL = "pip install 'sglang[all]' on a GPU host (or launcher = \"docker run --gpus all ... lmsysorg/sglang:TAG\")"
KNOBS = {"mem_fraction_static": "--mem-fraction-static", "max_running_requests": "--max-running-requests",
         "chunked_prefill_size": "--chunked-prefill-size", "page_size": "--page-size",
         "disable_radix_cache": "--disable-radix-cache", "disable_cuda_graph": "--disable-cuda-graph",
         "tp_size": "--tp-size", "attention_backend": "--attention-backend"}


def sampling_params(request: GenerationRequest) -> dict[str, Any]:
    s = request.sampling
    p: dict[str, Any] = {"max_new_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p,
                         "ignore_eos": s.ignore_eos}
    if s.top_k not in (None, -1, 0):
        p["top_k"] = s.top_k
    if s.min_p:
        p["min_p"] = s.min_p
    if s.stop:
        p["stop"] = list(s.stop)
    if s.seed is not None:
        p["sampling_seed"] = s.seed
    return p


def finish_type(meta: dict[str, Any]) -> str | None:
    fr = meta.get("finish_reason")
    return fr.get("type") if isinstance(fr, dict) else fr


class SGLangEngine(ModalEngine):
    name = "sglang"
    IMPLS = {"server": "adapters.sglang:SGLangServer", "attach": "adapters.sglang:SGLangServer",
             "in_process": "adapters.sglang:SGLangInProcess"}


class SGLangServer(HTTPServerEngine):
    """Options: url (attach) or the launch options of adapters/serving.py, kv_cache_tokens,
    and the server flags in `KNOBS` (booleans become bare flags)."""

    name = "sglang"
    OPTIONS = HTTPServerEngine.OPTIONS | set(KNOBS)
    INSTALL = INSTALL

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        self.client: httpx.AsyncClient | None = None
        self.incremental = False
        self._responses: dict[str, httpx.Response] = {}

    def flags(self) -> list[str]:
        out: list[str] = []
        for k, flag in KNOBS.items():
            v = self.options.get(k)
            if v is True:
                out.append(flag)
            elif v not in (None, False):
                out += [flag, str(v)]
        if self.options.get("kv_cache_tokens") is not None:
            out += ["--max-total-tokens", str(int(self.options["kv_cache_tokens"]))]
        return out

    def server_argv(self) -> list[str]:
        s = self.server
        args = ["--model-path", s.model_arg, "--host", s.host, "--port", s.port, "--dtype", self.dtype,
                "--enable-metrics", "--log-level", "warning", *self.flags()]
        return s.argv(module="sglang.launch_server", args=args,
                      container_cmd=["python3", "-m", "sglang.launch_server"])

    async def start(self) -> EngineInfo:
        if self.info is not None:
            return self.info
        try:
            base = await self.connect()
            self.client = httpx.AsyncClient(base_url=base, trust_env=False,
                                            timeout=httpx.Timeout(30.0, read=None, pool=None),
                                            limits=httpx.Limits(max_connections=None))
            si = await self._server_info()
            self.incremental = bool(si.get("incremental_streaming_output") or si.get("stream_output"))
            knobs = {"url": base, "incremental_streaming_output": self.incremental, **{
                k: self.options[k] for k in (*KNOBS, "kv_cache_tokens") if k in self.options}}
            self.info = EngineInfo(engine=self.name, version=str(si.get("version", "unknown")), model=self.model,
                                   dtype=self.dtype, kv_capacity_tokens=si.get("max_total_num_tokens"),
                                   block_size=si.get("page_size"), knobs=knobs,
                                   mode=self.mode, pid=self.pid)
        except BaseException:
            await self.stop()
            raise
        return self.info

    async def _server_info(self) -> dict[str, Any]:
        for path in ("/server_info", "/get_server_info"):
            try:
                resp = await self.client.get(path)
            except httpx.HTTPError as e:
                raise EngineUnavailable(f"no SGLang server answers at {self.client.base_url} ({e!r})") from e
            if resp.status_code == 200:
                return resp.json()
        raise EngineUnavailable(f"{self.client.base_url} has neither /server_info nor /get_server_info: not SGLang?")

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self.client is None:
            raise RuntimeError("engine 'sglang': call start() before generate()")
        rid = request.request_id
        body = {"input_ids": list(request.prompt_token_ids), "sampling_params": sampling_params(request),
                "stream": True, "rid": rid}
        diff = Incremental() if self.incremental else Cumulative()
        async with self.client.stream("POST", "/generate", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                raise RequestError(f"request {rid}: HTTP {resp.status_code} from SGLang: {resp.text[:500]}")
            self._responses[rid] = resp
            try:
                async for line in resp.aiter_lines():
                    recv_ns = time.perf_counter_ns()
                    data = line[5:].strip() if line.startswith("data:") else ""
                    if not data or data == "[DONE]":
                        continue
                    obj = json.loads(data)
                    if "error" in obj:
                        raise RequestError(f"request {rid}: SGLang error in stream: {obj['error']}")
                    ids, text = diff.feed(obj.get("output_ids") or [], obj.get("text") or "")
                    meta = obj.get("meta_info") or {}
                    reason = finish_type(meta)
                    if reason is not None:
                        yield TokenEvent(rid, ids, text, recv_ns, True, reason, meta.get("prompt_tokens"),
                                         meta.get("completion_tokens"))
                        return
                    if ids:
                        yield TokenEvent(rid, ids, text, recv_ns)
            except NotCumulative as e:
                raise RequestError(f"request {rid}: {e}") from e
            except (httpx.HTTPError, RuntimeError) as e:  # RuntimeError: closed by abort()
                if rid not in self._aborted:
                    raise RequestError(f"request {rid}: SGLang stream broke: {e!r}") from e
            finally:
                self._responses.pop(rid, None)
        if rid not in self._aborted:
            raise RequestError(f"request {rid}: SGLang stream ended without a finish_reason")
        self._aborted.discard(rid)
        yield TokenEvent(rid, [], recv_ns=time.perf_counter_ns(), finished=True, finish_reason="abort")

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)
        resp = self._responses.get(request_id)
        if self.client is not None:
            try:
                await self.client.post("/abort_request", json={"rid": request_id})
            except httpx.HTTPError:
                pass
        if resp is not None:
            await resp.aclose()

    async def reset_prefix_cache(self) -> bool:
        return self.client is not None and (await self.client.post("/flush_cache")).status_code == 200

    async def snapshot(self) -> MemorySnapshot:
        snap = MemorySnapshot(t_ns=time.perf_counter_ns())
        m = await prom.scrape(self.client, "/metrics") if self.client is not None else None
        if m is not None:
            usage, cap = m.value("sglang:token_usage"), self.info.kv_capacity_tokens if self.info else None
            snap.kv_usage, snap.kv_capacity_tokens = usage, cap
            snap.kv_used_tokens = round(usage * cap) if usage is not None and cap else None
            running, waiting = m.value("sglang:num_running_reqs"), m.value("sglang:num_queue_reqs")
            snap.num_running = int(running) if running is not None else None
            snap.num_waiting = int(waiting) if waiting is not None else None
        return snap

    async def close_clients(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.aclose()


class SGLangInProcess(Engine):
    """`sglang.Engine(...).async_generate(input_ids=..., stream=True)` in this interpreter
    (cumulative chunks, diffed like the server's)."""

    name = "sglang"
    OPTIONS = frozenset({"kv_cache_tokens", *KNOBS})

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        self.engine: Any = None
        self.info: EngineInfo | None = None

    async def start(self) -> EngineInfo:
        sgl = need("sglang", INSTALL)
        kw = {k: v for k, v in self.options.items() if k in KNOBS}
        if self.options.get("kv_cache_tokens") is not None:
            kw["max_total_tokens"] = int(self.options["kv_cache_tokens"])
        self.engine = sgl.Engine(model_path=self.model, dtype=self.dtype, **kw)
        si = self.engine.get_server_info()
        self.info = EngineInfo(engine=self.name, version=getattr(sgl, "__version__", "unknown"), model=self.model,
                               dtype=self.dtype, kv_capacity_tokens=si.get("max_total_num_tokens"),
                               block_size=si.get("page_size"), knobs=dict(self.options), mode="in_process")
        return self.info

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        rid, diff = request.request_id, Cumulative()
        stream = await self.engine.async_generate(input_ids=list(request.prompt_token_ids),
                                                  sampling_params=sampling_params(request), stream=True, rid=rid)
        async for obj in stream:
            recv_ns = time.perf_counter_ns()
            ids, text = diff.feed(obj.get("output_ids") or [], obj.get("text") or "")
            meta = obj.get("meta_info") or {}
            if finish_type(meta) is not None:
                yield TokenEvent(rid, ids, text, recv_ns, True, finish_type(meta), meta.get("prompt_tokens"),
                                 meta.get("completion_tokens"))
                return
            if ids:
                yield TokenEvent(rid, ids, text, recv_ns)

    async def abort(self, request_id: str) -> None:
        # sglang.Engine has no public abort; its tokenizer manager does (internal API, may move).
        manager = getattr(self.engine, "tokenizer_manager", None)
        if manager is not None:
            manager.abort_request(rid=request_id)

    async def reset_prefix_cache(self) -> bool:
        return bool(self.engine.flush_cache()) if self.engine is not None else False

    async def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(t_ns=time.perf_counter_ns())

    async def stop(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()
