"""SGLang: its native server (`python -m sglang.launch_server`) launched or attached, or
`sglang.Engine` in-process.

- Requests go to the native `POST /generate` with `input_ids` (token-exact prompts) and
  `sampling_params {max_new_tokens, temperature, top_p, top_k, min_p, ignore_eos, stop}`,
  `stream: true`; the SSE stream ends with `data: [DONE]`. Each event carries `output_ids`
  and `text` *cumulatively* unless the server runs with `--incremental-streaming-output`
  (read from /server_info at start), so the adapter diffs (adapters/transport/deltas.py).
- `meta_info.finish_reason` is null until the last event, then `{"type": "length"|"stop"|
  "abort", ...}`; `meta_info.prompt_tokens` / `completion_tokens` are the engine's counts.
- Features (adapters.common.features): `enable_prefix_caching = false` -> `--disable-radix-cache` (the
  radix cache is SGLang's prefix cache, on by default); `speculative_config` ngram ->
  `--speculative-algorithm NGRAM --speculative-num-draft-tokens k+1 --speculative-ngram-max-bfs-breadth 1`
  (SGLang's draft-token count includes the verified root token; breadth 1 makes the draft one chain
  of k, as vLLM's), draft_model -> `--speculative-algorithm STANDALONE --speculative-draft-model-path
  DIR --speculative-num-steps k --speculative-eagle-topk 1 --speculative-num-draft-tokens k+1`.
  SGLang's NGRAM looks up a trie built from every request's tokens (depth
  --speculative-ngram-max-trie-depth), not the request's own last 2..5 tokens: prompt_lookup_min/max
  have no SGLang equivalent and `unhonoured` says so.
- `EngineInfo.effective` / `.memory` from `/server_info` (the resolved server arguments, the
  scheduler's `max_total_num_tokens`, and `internal_states[0]`: `effective_max_running_requests_per_dp`
  and `memory_usage` {weight, kvcache, graph} in GiB rounded to 0.001).
- KV capacity: `max_total_num_tokens` from `/server_info` (older servers: `/get_server_info`);
  block size = `page_size`. `kv_cache_tokens` is passed as `--max-total-tokens`, which is an
  upper bound (SGLang takes the minimum of it and what fits in memory): a capacity that is
  not the budget is reported in `EngineInfo.unhonoured`. Usage: the SGLANG row of
  adapters.transport.metric_names at /metrics (the server is started with `--enable-metrics`).
- `reset_prefix_cache` = `POST /flush_cache` (400 while requests run); `abort` =
  `POST /abort_request {"rid"}` and closing the connection.
- In-process: `sglang.Engine`'s sync helpers (`get_server_info()`, `flush_cache()`) drive
  its event loop with `run_until_complete`, which raises inside a running loop such as the
  harness's; the adapter awaits the tokenizer manager's coroutines instead.
- Versions: `sglang_settings.VERSIONS` (0.5.9-0.5.23, rows checked per release) picks the launch
  flags (`--disable-cuda-graph` before 0.5.14, `--cuda-graph-backend-{decode,prefill} disabled`
  after) and metric names; the version comes from the launcher's installed package or image tag
  before launch (else the newest row) and from /server_info after, where a version no row covers
  is refused in one line, as is a server whose version needs other flags than it was launched with.
No CPU build installs from PyPI (SGLang's CPU backend needs Intel AMX and a source build).
The launch command and request bodies are checked against SGLang's own argument parser and
request models (tests/adapters/sglang_contract.py, in .venv-sglang); the responses against
SGLang's recorded ones (tests/adapters/fixtures/sglang/SOURCE.md).
"""
from __future__ import annotations

import time
from typing import Any, AsyncIterator

import httpx

from adapters.base import (Engine, EngineInfo, EngineUnavailable, GenerationRequest, MemorySnapshot, RequestError,
                           TokenEvent, check_options)
from adapters.common import features
from adapters.common.versions import Row, launcher_version
from adapters.engines.sglang.settings import (GRAPHS_OFF_OLD, IMAGE, KV_HOW, NGRAM_WINDOW, SGLANG, VERSIONS,
                                              feature_args, feature_flags, read_back, reported_dtype)
from adapters.transport import prom, sse
from adapters.transport.deltas import Cumulative, Incremental, NotCumulative
from adapters.transport.server import HeldEngine, LaunchedServer, aclose_then, kv_pin_gap, need

INSTALL = (f"pip install 'sglang[all]==0.5.23' on a GPU host "
           f"(or launcher = \"docker run --gpus all ... {IMAGE}\")")
# option -> server flags (a boolean option adds its flags when true); disable_cuda_graph's flags
# depend on the version (sglang_settings.VERSIONS: the argument-groups refactor renamed them).
KNOBS = {"mem_fraction_static": ["--mem-fraction-static"], "max_running_requests": ["--max-running-requests"],
         "chunked_prefill_size": ["--chunked-prefill-size"], "page_size": ["--page-size"],
         "disable_radix_cache": ["--disable-radix-cache"], "disable_cuda_graph": [],
         "tp_size": ["--tp-size"], "pp_size": ["--pp-size"], "dp_size": ["--dp-size"],
         "attention_backend": ["--attention-backend"],
         # off by default (its batch-invariant kernels are slower): without it a seeded sampled
         # workload runs unseeded on SGLang, and the report says so (seeded_sampling read back)
         "enable_deterministic_inference": ["--enable-deterministic-inference"],
         "max_model_len": ["--context-length"]}  # the harness's one length for every engine (experiments/workload/context.py)
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


def generate_body(request: GenerationRequest) -> dict[str, Any]:
    """`POST /generate`: token ids in, streamed (GenerateReqInput fields)."""
    return {"input_ids": list(request.prompt_token_ids), "sampling_params": sampling_params(request),
            "stream": True, "rid": request.request_id}


def finish_type(meta: dict[str, Any]) -> str | None:
    fr = meta.get("finish_reason")
    return fr.get("type") if isinstance(fr, dict) else fr


def unhonoured(asked_dtype: str, info: dict[str, Any], asked_kv: int | None, how: str,
               options: dict[str, Any] | None = None, effective: dict[str, Any] | None = None) -> dict[str, str]:
    out: dict[str, str] = {}
    spec = features.speculative("sglang", (options or {}).get("speculative_config"))
    if spec is not None and spec["method"] == "ngram":
        out["speculative_config.prompt_lookup"] = NGRAM_WINDOW
    for k, why in features.gaps("sglang", options or {}, effective or {}).items():
        out.setdefault(k, why)
    ran = reported_dtype(info, asked_dtype)
    if ran != asked_dtype:
        out["dtype"] = f"sglang: {asked_dtype} was asked, the server reports dtype {ran}"
    gap = kv_pin_gap(asked_kv, info.get("max_total_num_tokens"), info.get("page_size"), "sglang", how)
    if gap:
        out["kv_cache_tokens"] = gap
    return out


class SGLangServer(LaunchedServer, Engine):
    """Options: url (attach) or the launch options of adapters/transport/server.py, kv_cache_tokens,
    and the server flags in `KNOBS` (booleans become bare flags)."""

    OPTIONS = LaunchedServer.OPTIONS | {"kv_cache_tokens", *KNOBS, *features.OPTIONS}
    INSTALL = INSTALL

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        feature_args(self.options)  # checked at construction
        self.client: httpx.AsyncClient | None = None
        self.incremental = False
        self.info: EngineInfo | None = None
        self._streamer: sse.Streamer | None = None  # the measured path (adapters/transport/sse.py)
        self._responses: dict[str, sse.Stream] = {}
        self._aborted: set[str] = set()  # ids whose remaining events are dropped
        self.row: Row | None = None  # VERSIONS row the launch flags came from

    def launch_row(self) -> Row:
        """The version-table row for the SGLang this launcher runs (its installed package or its
        image tag); when that cannot be told, the newest row, checked again against /server_info."""
        if self.row is None:
            launcher = self.server.launcher if self.server is not None else None
            found = launcher_version(launcher, "sglang") if launcher else None
            self.row = VERSIONS.row(found) if found else VERSIONS.newest()
        return self.row

    def flags(self) -> list[str]:
        out: list[str] = []
        for k, flag in KNOBS.items():
            v = self.options.get(k)
            if k == "disable_cuda_graph":
                flag = self.launch_row().values["graphs_off"] if v else []
            if k == "disable_radix_cache" and "disable_radix_cache" in feature_args(self.options):
                continue  # rendered once, by feature_flags
            if v is True:
                out += flag
            elif v not in (None, False):
                out += [*flag, str(v)]
        if self.options.get("kv_cache_tokens") is not None:
            out += ["--max-total-tokens", str(int(self.options["kv_cache_tokens"]))]
        return out + feature_flags(self.options)

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
            self._streamer = await sse.Streamer(base).open()
            si = await self._server_info()
            row = self._check_version(si)
            self.incremental = bool(si.get("incremental_streaming_output") or si.get("stream_output"))
            knobs = {"url": base, "incremental_streaming_output": self.incremental, **self.launch_knobs(), **{
                k: self.options[k] for k in (*KNOBS, "kv_cache_tokens", *features.OPTIONS) if k in self.options}}
            how = KV_HOW if self.server is not None else "an already running server (its budget was fixed at start)"
            names = row.values["metrics"]
            has_metrics = await prom.scrape(self.client, names.path, names.prefixes()) is not None
            effective, memory = read_back(si, self.launch_argv, self.dtype)
            self.info = EngineInfo(engine=self.name, version=str(si.get("version", "unknown")), model=self.model,
                                   dtype=reported_dtype(si, self.dtype), kv_capacity_tokens=si.get("max_total_num_tokens"),
                                   block_size=si.get("page_size"), knobs=knobs, mode=self.mode, pid=self.pid,
                                   metrics_url=base + names.path if has_metrics else None,
                                   unhonoured=unhonoured(self.dtype, si, self.options.get("kv_cache_tokens"), how,
                                                         self.options, effective),
                                   effective=effective, memory=memory)
        except BaseException:
            await self.stop()
            raise
        return self.info

    def _check_version(self, si: dict[str, Any]) -> Row:
        """The row for the version the server reports (refused when no row covers it); a launch
        whose flags came from another row with other flags is refused too."""
        row = VERSIONS.row(str(si.get("version")) if si.get("version") else None)
        if self.row is not None and self.options.get("disable_cuda_graph") and \
                row.values["graphs_off"] != self.row.values["graphs_off"]:
            raise EngineUnavailable(f"sglang {si.get('version')} was launched with the flags of {self.row.span()} "
                                    f"({' '.join(self.row.values['graphs_off'])}); set the launcher so its version can "
                                    f"be found before launch (a venv, or a versioned image such as {IMAGE})")
        self.row = row
        return row

    async def _server_info(self) -> dict[str, Any]:
        for path in ("/server_info", "/get_server_info"):
            try:
                resp = await self.client.get(path)
            except httpx.HTTPError as e:
                raise EngineUnavailable(f"no SGLang server answers at {self.client.base_url} ({e!r})") from e
            if resp.status_code == 200:
                return resp.json()
        raise EngineUnavailable(f"{self.client.base_url} has neither /server_info nor /get_server_info: not SGLang?")

    @staticmethod
    def request_body(request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        return "/generate", generate_body(request)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if self.client is None:
            raise RuntimeError("engine 'sglang': call start() before generate()")
        rid = request.request_id
        body = generate_body(request)
        diff = Incremental() if self.incremental else Cumulative()
        async with self._streamer.post("/generate", body) as resp:
            if resp.status_code != 200:
                raise RequestError(f"request {rid}: HTTP {resp.status_code} from SGLang: {(await resp.text())[:500]}")
            self._responses[rid] = resp
            try:
                async for recv_ns, obj in resp.data():
                    if "error" in obj:
                        raise RequestError(f"request {rid}: SGLang error in stream: {obj['error']}")
                    ids, text = diff.feed(obj.get("output_ids") or [], obj.get("text") or "")
                    meta = obj.get("meta_info") or {}
                    reason = finish_type(meta)
                    if reason is not None:
                        yield TokenEvent(rid, ids, text, recv_ns, True, reason, meta.get("prompt_tokens"),
                                         meta.get("completion_tokens"), resp.wire)
                        return
                    if ids:
                        yield TokenEvent(rid, ids, text, recv_ns, wire=resp.wire)
            except NotCumulative as e:
                raise RequestError(f"request {rid}: {e}") from e
            except sse.StreamClosed:  # abort() closed it
                pass
            except sse.StreamError as e:
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
            resp.close()

    async def reset_prefix_cache(self) -> bool:
        return self.client is not None and (await self.client.post("/flush_cache")).status_code == 200

    async def snapshot(self) -> MemorySnapshot:
        names = self.row.values["metrics"] if self.row is not None else SGLANG
        m = await prom.scrape(self.client, names.path, names.prefixes()) if self.client is not None else None
        return prom.snapshot(m, names, self.info.kv_capacity_tokens if self.info else None)

    async def stop(self) -> None:
        client, self.client = self.client, None
        streamer, self._streamer = self._streamer, None
        await aclose_then(client, self.disconnect, streamer)


async def engine_server_info(engine: Any) -> dict[str, Any]:
    """What `sglang.Engine.get_server_info()` reports that this adapter reads, without its
    `run_until_complete` (which raises inside a running event loop): the scheduler's info
    (`max_total_num_tokens`), the resolved server arguments (`page_size`, `dtype`, ...) and,
    when the tokenizer manager has it, the per-rank internal state (memory split)."""
    sched = getattr(engine, "scheduler_info", None)
    if sched is None:
        sched = engine._scheduler_init_result.scheduler_infos[0]
    manager = engine.tokenizer_manager
    args = manager.server_args
    resolved = args.resolved_dict() if hasattr(args, "resolved_dict") else {}
    info = {**resolved, **dict(sched), "page_size": getattr(args, "page_size", None),
            "dtype": getattr(args, "dtype", None)}
    if hasattr(manager, "get_internal_state"):
        info["internal_states"] = await manager.get_internal_state()
    return info


class SGLangInProcess(HeldEngine):
    """`sglang.Engine(...).async_generate(input_ids=..., stream=True)` in this interpreter
    (cumulative chunks, diffed like the server's)."""

    OPTIONS = frozenset({"kv_cache_tokens", *KNOBS, *features.OPTIONS})

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        feature_args(self.options)
        self.engine: Any = None
        self.info: EngineInfo | None = None

    async def start(self) -> EngineInfo:
        sgl = need("sglang", INSTALL)
        row = VERSIONS.row(getattr(sgl, "__version__", None))  # refuses a version no row was checked for
        kw = {k: v for k, v in self.options.items() if k in KNOBS and k != "disable_cuda_graph"}
        if "max_model_len" in kw:  # ServerArgs' name for --context-length
            kw["context_length"] = kw.pop("max_model_len")
        if self.options.get("disable_cuda_graph"):  # ServerArgs fields of the version installed here
            if row.values["graphs_off"] == GRAPHS_OFF_OLD:
                kw["disable_cuda_graph"] = True
            else:
                kw.update(cuda_graph_backend_decode="disabled", cuda_graph_backend_prefill="disabled")
        if self.options.get("kv_cache_tokens") is not None:
            kw["max_total_tokens"] = int(self.options["kv_cache_tokens"])
        kw.update(feature_args(self.options))
        self.engine = sgl.Engine(model_path=self.model, dtype=self.dtype, **kw)
        si = await engine_server_info(self.engine)
        effective, memory = read_back(si, None, self.dtype)
        self.info = EngineInfo(engine=self.name, version=getattr(sgl, "__version__", "unknown"), model=self.model,
                               dtype=reported_dtype(si, self.dtype), kv_capacity_tokens=si.get("max_total_num_tokens"),
                               block_size=si.get("page_size"), knobs=dict(self.options), mode="in_process",
                               unhonoured=unhonoured(self.dtype, si, self.options.get("kv_cache_tokens"), KV_HOW,
                                                     self.options, effective),
                               effective=effective, memory=memory)
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
        """The tokenizer manager's flush, awaited; its result object is always truthy, so
        its `success` field is what says whether the cache was flushed."""
        if self.engine is None:
            return False
        return bool(getattr(await self.engine.tokenizer_manager.flush_cache(), "success", False))
