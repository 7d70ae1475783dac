"""Hugging Face TGI (text-generation-inference): launched or attached; no in-process mode.

In maintenance mode upstream since December 2025 (kept to compare existing deployments). Facts
it relies on: tests/adapters/fixtures/tgi/SOURCE.md, adapters/engines/tgi/upstream.json (file@tag each).

- Server: `text-generation-launcher --model-id M --hostname H --port P --dtype D [...]`, or its image
  (`docker run --gpus all ... ghcr.io/huggingface/text-generation-inference:3.3.7`: the launcher).
- dtype: the launcher's `--dtype` knows float16 and bfloat16 only. A float32 config is
  launched with `--dtype bfloat16` (without `--dtype` the model's own default would run,
  which the adapter could not name); `EngineInfo.dtype` is what ran and
  `EngineInfo.unhonoured["dtype"]` says what was asked.
- KV budget: `--max-batch-total-tokens` is ignored for Flash-Attention models (TGI warns it
  is deprecated there and uses the value it infers from free memory). The capacity TGI runs
  with is the `tgi_batch_max_total_tokens` gauge at /metrics (the startup log line "Setting
  max batch total tokens to N" in server mode; `/info` carried it only before v2.3.0); a
  budget that is not what it runs with is reported in `EngineInfo.unhonoured`.
- Requests: `POST /` (TGI's compat route; `stream: true` streams as /generate_stream does) through
  `huggingface_hub.AsyncInferenceClient` (`details=True`: every event carries its token id). TGI takes
  text: `request.prompt_text`, or the ids decoded with tokenizer.json; `details.input_length` lets
  the harness flag a re-tokenization mismatch.
- No `ignore_eos`: TGI's router sets `ignore_eos_token: false` for every request, so a
  request may stop before max_new_tokens (`unhonoured["ignore_eos"]`).
- `abort` takes effect at the request's next event (TGI cancels a request whose client went
  away). recv_ns is taken after huggingface_hub parsed the event.
- Features (adapters.common.features): `enable_prefix_caching` -> the launcher's environment
  `PREFIX_CACHING=1|0` (TGI's only switch; default on for Flash models with flashinfer or
  flashdecoding attention); `speculative_config` ngram -> `--speculate k` (TGI's n-gram copies the
  k tokens that followed the first earlier occurrence of the last token: a one-token match, so
  prompt_lookup_min/max are unhonoured); draft_model is unhonoured (TGI speculates only with
  Medusa / MLP-speculator heads shipped in the model folder, or n-gram), and the server is
  launched without speculation. An attached server's features were fixed at its start.
- Prometheus port: since v3.3.0 the router binds one (`--prometheus-port`, env `PROMETHEUS_PORT`,
  default 9000; two servers on `--network host` collide): a launch gets a free one through the
  environment (a 2.x launcher ignores it rather than refuse a flag); `knobs["prometheus_port"]`.
- Versions: `VERSIONS` (checked releases; what each reports: `REPORTS`); an image tag is trusted,
  else `text-generation-launcher --version` before launch, and `/info` after.
- `EngineInfo.effective` from `/info` (max_total_tokens: the per-request context), the KV gauge,
  and in server mode the launch log: the launcher's `Args { .. dtype: Some(BFloat16) .. }` (the
  `--dtype` it was given: that row is labelled as requested; `/info` `model_dtype`, before v2.3.0,
  is what the server reports), the
  shard's "Using prefix caching = True", "Using speculation n-gram with 3 input ids.", "KV-cache
  blocks: N, size: B", "Cuda Graphs are enabled for sizes [...]" and the router's "Setting max
  batch total tokens to N". TGI reports no memory split (`EngineInfo.memory` stays empty).
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, AsyncIterator

import httpx

from adapters.base import (Engine, EngineInfo, EngineUnavailable, GenerationRequest, MemorySnapshot, RequestError,
                           TokenEvent)
from adapters.common import features
from adapters.common.readback import ReadBack, launch_command
from adapters.common.versions import image_tag_version
from adapters.engines.tgi.settings import (DTYPES, IMAGE, LAUNCHER_VERSION, LOG_PROMETHEUS_PORT, TGI, VERSIONS,
                                           launch_dtype, log_read_back, max_batch_total_tokens, unhonoured_features)
from adapters.transport import prom
from adapters.transport.launcher import free_port
from adapters.transport.server import LaunchedServer, aclose_then, kv_pin_gap, need

INSTALL = ("install text-generation-launcher (TGI 3.3.x) on a GPU host, or set launcher = "
           "\"docker run --gpus all --shm-size 1g --network host -v {model}:{model} "
           f"{IMAGE}\"")
KNOBS = ("max_concurrent_requests", "max_batch_prefill_tokens", "max_total_tokens", "max_input_tokens",
         "cuda_memory_fraction", "num_shard", "quantize")
KV_HOW = ("--max-batch-total-tokens (ignored for Flash-Attention models, which use the value TGI infers "
          "from free memory; cuda_memory_fraction is the knob that moves it)")
FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}
NO_IGNORE_EOS = ("TGI has no ignore_eos (its router sets ignore_eos_token=false for every request): a request "
                 "may stop at EOS before max_tokens")
def hub_kwargs(request: GenerationRequest) -> dict[str, Any]:
    """huggingface_hub's `text_generation` arguments for a request (None is not sent)."""
    s = request.sampling
    greedy = s.temperature == 0
    return dict(max_new_tokens=s.max_tokens, details=True, do_sample=not greedy,
                temperature=None if greedy else s.temperature, top_p=s.top_p if 0 < s.top_p < 1 else None,
                top_k=s.top_k if s.top_k and s.top_k > 0 else None, seed=s.seed, stop=list(s.stop) or None)


# /info `router` of TGI itself: env!("CARGO_PKG_NAME") of router/Cargo.toml (router/src/server.rs @ v3.3.7)
TGI_ROUTER = "text-generation-router"


class TGIServer(LaunchedServer, Engine):
    METRICS = TGI  # what the dry run lists (snapshot() and the server's own view read the row of its version)
    OPTIONS = LaunchedServer.OPTIONS | {"kv_cache_tokens", "max_model_len", *KNOBS, *features.OPTIONS}
    INSTALL, VERSIONS = INSTALL, VERSIONS  # adapters/checks/contracts.py reads the table from the adapter

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        if self.options.get("max_model_len") is not None and \
                {"max_total_tokens", "max_input_tokens"} & {k for k, v in self.options.items() if v is not None}:
            raise ValueError("engine 'tgi': max_model_len sets --max-total-tokens and --max-input-tokens; "
                             "set either it or them")
        features.prefix_caching(self.name, self.options)
        self.speculative = features.speculative(self.name, self.options.get("speculative_config"))
        self.client: Any = None
        self.http: httpx.AsyncClient | None = None
        self.tokenizer: Any = None
        self.info: EngineInfo | None = None
        self._aborted: set[str] = set()
        self.prometheus_port: int | None = None  # chosen at launch (server_env)

    def image_tag(self) -> str | None:
        """The release a container launcher's image tag names (trusted over what the server reports)."""
        launcher = self.server.launcher if self.server is not None else None
        return image_tag_version(launcher.prefix) if launcher is not None and launcher.is_container else None

    def launcher_version(self) -> str | None:
        """The version string the launcher reports, without starting a server (None: unknown, or a
        container, whose release is its image tag)."""
        launcher = self.server.launcher
        if launcher.is_container:
            return None
        try:
            out = subprocess.run([launcher.find_script("text-generation-launcher"), "--version"],
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired, EngineUnavailable):
            return None
        m = LAUNCHER_VERSION.search(out.stdout)
        return m.group(1) if m else None

    def server_argv(self) -> list[str]:
        s = self.server
        found, tag = (self.launcher_version(), self.image_tag()) if s.launcher else (None, None)
        if found or tag:
            VERSIONS.row(found, tag)  # refuses a version outside the table before anything starts
        args: list[str] = ["--model-id", s.model_arg, "--hostname", s.host, "--port", s.port,
                           "--dtype", launch_dtype(self.dtype)]
        if self.options.get("kv_cache_tokens") is not None:
            args += ["--max-batch-total-tokens", str(int(self.options["kv_cache_tokens"]))]
        n = self.options.get("max_model_len")
        if n is not None:  # the harness's one length (experiments/workload/context.py); TGI wants input < total
            args += ["--max-total-tokens", str(int(n)), "--max-input-tokens", str(int(n) - 1)]
        for k in KNOBS:
            if self.options.get(k) is not None:
                args += ["--" + k.replace("_", "-"), str(self.options[k])]
        if self.speculative is not None and self.speculative["method"] == "ngram":
            args += ["--speculate", str(self.speculative["num_speculative_tokens"])]
        return s.argv(script="text-generation-launcher", args=args, container_cmd=[])

    def server_env(self, work_dir: Path | None) -> dict[str, str]:
        """PREFIX_CACHING for the launcher (it passes it on to the shards) when the option is set,
        and a free PROMETHEUS_PORT (the module docstring says why an environment variable)."""
        if self.prometheus_port is None:
            self.prometheus_port = free_port()
        prefix = self.options.get("enable_prefix_caching")
        env = {"PROMETHEUS_PORT": str(self.prometheus_port)}
        return env if prefix is None else {**env, "PREFIX_CACHING": "1" if prefix else "0"}

    def prometheus_knob(self) -> str | None:
        """Which Prometheus port the launched server took, from its launcher's Args print."""
        if self.server is None or self.server.proc is None:
            return None
        found = LOG_PROMETHEUS_PORT.findall(self.server.log_text())
        if not found:
            return f"{self.prometheus_port} asked (PROMETHEUS_PORT); this launcher's Args have no prometheus_port"
        return f"{found[-1]} (launcher Args prometheus_port; {self.prometheus_port} asked)"

    def read_back(self, info: dict[str, Any], capacity: int | None) -> tuple[dict[str, Any], dict[str, int]]:
        """EngineInfo.effective from the launch log (server mode), the KV gauge and /info."""
        rb = ReadBack()
        reported = info.get("model_dtype")  # the dtype the server runs, in /info before v2.3.0
        rb.put("dtype", str(reported).removeprefix("torch.") if reported else None, "/info model_dtype (TGI < 2.3)")
        if self.server is not None and self.server.proc is not None:
            log_read_back(rb, self.server.log_text(), f"launch log {self.server.proc.log_path}")
        rb.put("kv_capacity_tokens", capacity, "tgi_batch_max_total_tokens at /metrics, else /info (TGI < 2.3)")
        rb.put("max_model_len", info.get("max_total_tokens"), "/info max_total_tokens")
        rb.put("launch_command", launch_command(self.launch_argv), "the argv this adapter launched")
        return rb.result()

    def dtype_ran(self, info: dict[str, Any]) -> str | None:
        """The dtype the server runs: what we launched it with, else /info's `model_dtype`
        (TGI < 2.3.0 only), else None (unknown)."""
        if self.server is not None:
            return launch_dtype(self.dtype)
        reported = info.get("model_dtype")
        return str(reported).removeprefix("torch.") if reported else None

    def unhonoured(self, ran: str | None, capacity: int | None,
                   effective: dict[str, Any] | None = None) -> dict[str, str]:
        out = {"ignore_eos": NO_IGNORE_EOS, **unhonoured_features(self.options, self.server is None)}
        for k, why in features.gaps(self.name, self.options, effective or {}).items():
            out.setdefault(k, why)
        if self.dtype not in DTYPES:
            out["dtype"] = (f"TGI runs float16/bfloat16 only: {self.dtype} was asked, "
                            + (f"{ran} ran" if ran else "the attached server's dtype is not reported "
                               "(/info has no model_dtype since v2.3.0)"))
        elif ran is not None and ran != self.dtype:
            out["dtype"] = f"{self.dtype} was asked, the attached server runs {ran}"
        how = KV_HOW if self.server is not None else "an already running server (its budget was fixed at start)"
        gap = kv_pin_gap(self.options.get("kv_cache_tokens"), capacity, None, self.name, how)
        if gap:
            out["kv_cache_tokens"] = gap
        return out

    async def start(self) -> EngineInfo:
        if self.info is not None:
            return self.info
        hub = need("huggingface_hub", "pip install huggingface-hub")
        try:
            base = await self.connect()
            self.http = httpx.AsyncClient(base_url=base, trust_env=False, timeout=30.0)
            info = await self._info(base)
            if info.get("router", TGI_ROUTER) == TGI_ROUTER:  # TGI itself: refuse a version no row was checked for
                VERSIONS.row(str(info["version"]) if info.get("version") else None,
                             self.image_tag() or VERSIONS.release_of(info.get("sha")))
            # else another server speaking TGI's API (e.g. `inferlab serve`): TGI's table does not apply
            self.client = hub.AsyncInferenceClient(base_url=base)
            metrics = await prom.scrape(self.http, TGI.path)
            cap, _ = prom.kv_capacity(metrics, TGI)
            if cap is None:
                cap = info.get("max_batch_total_tokens")  # TGI < 2.3.0
            if cap is None and self.server is not None:
                cap = max_batch_total_tokens(self.server.log_text())
            effective, memory = self.read_back(info, cap)
            ran = effective.get("dtype") or self.dtype_ran(info)
            knobs = {"url": base, "ignore_eos": "unsupported", "prompt": "text", **self.launch_knobs(),
                     **({"prometheus_port": self.prometheus_knob()} if self.prometheus_knob() else {}),
                     **{k: self.options[k] for k in (*KNOBS, "kv_cache_tokens", *features.OPTIONS)
                        if k in self.options}}
            self.info = EngineInfo(engine=self.name, version=str(info.get("version", "unknown")),
                                   model=str(info.get("model_id", self.model)), dtype=ran or "unknown",
                                   kv_capacity_tokens=cap, block_size=effective.get("block_size"), knobs=knobs,
                                   mode=self.mode, pid=self.pid,
                                   metrics_url=base + TGI.path if metrics is not None else None,
                                   unhonoured=self.unhonoured(ran, cap, effective), effective=effective,
                                   memory=memory)
        except BaseException:
            await self.stop()
            raise
        return self.info

    async def _info(self, base: str) -> dict[str, Any]:
        """GET /info ({} when the server has none: version stays unknown)."""
        try:
            resp = await self.http.get("/info")
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"no TGI server answers at {base} ({e!r})") from e
        try:
            return resp.json() if resp.status_code == 200 else {}
        except ValueError:
            return {}

    def request_body(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        """`POST /` as huggingface_hub builds it (its own payload code; None values are dropped)."""
        from huggingface_hub.inference._providers import get_provider_helper

        url = self.url or "http://HOST:PORT"
        req = get_provider_helper("hf-inference", task="text-generation", model=url).prepare_request(
            inputs=self.prompt_text(request), parameters=hub_kwargs(request), extra_payload={"stream": True},
            headers={}, model=url, api_key=None)
        return "/", req.json

    def prompt_text(self, request: GenerationRequest) -> str:
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
        rid = request.request_id
        try:
            stream = await self.client.text_generation(self.prompt_text(request), stream=True, **hub_kwargs(request))
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
        m = await prom.scrape(self.http, TGI.path, TGI.prefixes()) if self.http is not None else None
        return prom.snapshot(m, TGI, self.info.kv_capacity_tokens if self.info else None)

    async def stop(self) -> None:
        http, self.http, self.client = self.http, None, None
        await aclose_then(http, self.disconnect)
