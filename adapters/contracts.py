"""Per engine, what a dry run (adapters/dryrun.py) adds beyond the launch: the start-up requests,
the version it expects and how it reads it back, the metrics and settings it reads (each with
its source), and the checks of the launch and the bodies against upstream at the pinned tag:

| engine | launch flags | request bodies | version |
|---|---|---|---|
| vllm | vLLM's own parser (.venv-vllm) | vLLM's CompletionRequest / ChatCompletionRequest | GET /version |
| sglang | SGLang's own parser (.venv-sglang) | GenerateReqInput fields, SamplingParams | GET /server_info |
| trtllm | upstream/trtllm.json serve_flags; the options file against llm_args | requests (extra="forbid") | GET /version |
| tgi | upstream/tgi.json launcher_flags at the tag | POST / (CompatGenerateRequest) fields | GET /info, Cargo.toml@tag |
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from adapters.dryrun import (Check, DryRun, check_fields, check_flags, check_mounts, facts, metric_lines,
                             own_code_checks, short, venv_python)
from adapters.metric_names import TGI
from adapters.versions import IMAGES, image_tag_version, launcher_version

READS = {  # settings each adapter reads back at start, and where from (adapters/readback.py and the adapters)
    "vllm": ["GET /server_info?config_format=json (dev mode, on for launched servers): dtype, KV geometry, "
             "scheduler limits, prefix caching, CUDA graphs, speculation, parallel sizes",
             "vllm:cache_config_info labels (KV blocks x block size, per replica)", "GET /v1/models max_model_len",
             "the startup log: engine config, KV size and memory lines"],
    "sglang": ["GET /server_info: dtype (as requested), max_total_num_tokens, page_size, context_length, "
               "chunked_prefill_size, disable_radix_cache, cuda_graph_config, speculative_*, tp/pp/dp size, "
               "enable_deterministic_inference (seeded sampling), internal_states[0].memory_usage"],
    "trtllm": ["GET /prometheus/metrics: trtllm_model_config_info (dtype as requested, max_model_len), "
               "trtllm_parallel_config_info, trtllm_speculative_config_info, trtllm_kv_cache_config_info, "
               "KV block gauges, trtllm_max_num_active_requests, trtllm_max_num_tokens_runtime",
               "chunked prefill: as requested (the options file; nothing reports it)"],
    "tgi": ["GET /info: version, sha, max_total_tokens", "GET /metrics tgi_batch_max_total_tokens (KV capacity)",
            "the launch log: the launcher's Args print (dtype as requested), prefix caching, speculation, "
            "KV-cache blocks, CUDA graph sizes, 'Setting max batch total tokens'"],
}


def startup_requests(adapter: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """Requests an adapter sends at start, before the workload (OpenAI servers: the probe)."""
    if hasattr(adapter, "probe_body"):
        if adapter.served_model_name is None:  # the server lists the model under its path by default
            adapter.served_model_name = adapter.server.model_arg if adapter.server else "(GET /v1/models)"
        return [("start-up probe", "/v1/completions", adapter.probe_body())]
    return []


def check(adapter: Any, d: DryRun) -> None:
    """Fill in `d`'s version, metrics and settings lines and the engine's own checks."""
    names = getattr(adapter, "METRICS", None)
    if adapter.name == "sglang":
        names = adapter.launch_row().values["metrics"]
    elif adapter.name == "tgi":
        names = TGI
    d.metrics = metric_lines(names) if names is not None else []
    d.settings = READS.get(adapter.name, ["GET /v1/models, the first /metrics scrape"])
    CHECKS.get(adapter.name, _own)(adapter, d)


def first_per_route(adapter: Any, requests: list[Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, route, body) of the first request the workload sends on each route, built by the
    adapter's own body code (what `generate()` sends)."""
    out, seen = [], set()
    for r in requests:
        route, body = adapter.request_body(r)
        if route not in seen:
            seen.add(route)
            out.append((f"first {route} request ({r.request_id})", route, body))
    return out


def plan_launched(adapter: Any, requests: list[Any], fallback_launcher: str | None) -> DryRun:
    """A server adapter's dry run: its launch (or the pinned image's, where the engine is not
    installed here and the config names no launcher), bodies, version, metrics, settings, and the
    engine's contract checks (adapters/contracts.py)."""
    d = DryRun(adapter.name, adapter.mode)
    if adapter.server is None:
        d.note = f"attached to {adapter.url}: nothing is launched; its flags were fixed when it started"
    else:
        d.launch = adapter.launch_plan(installed=False)
        if d.launch.missing and not adapter.options.get("launcher") and fallback_launcher:
            d.note = f"{d.launch.missing}: shown with the pinned image, as scripts/gpu_compare.sh launches it"
            d.launch = adapter.launch_plan(installed=False, launcher=fallback_launcher)
        elif d.launch.missing:
            d.note = d.launch.missing
        d.checks += check_mounts(d.launch, adapter.server.launcher.is_container)
    d.requests = startup_requests(adapter) + first_per_route(adapter, requests)
    check(adapter, d)
    return d


def _own(adapter: Any, d: DryRun) -> None:
    d.version = ["this checkout's engine (GET /version)"]
    d.checks.append(Check(None, "launch and bodies", "inferlab's own server", "tested by tests/reference_engine/server"))


def _launcher_python(adapter: Any) -> str | None:
    launcher = adapter.server.launcher if adapter.server is not None else None
    return launcher.prefix[0] if launcher is not None and not launcher.is_container else None


def _found(adapter: Any, dist: str) -> str:
    launcher = adapter.server.launcher if adapter.server is not None else None
    if launcher is None:
        return "attached: the server's own report decides"
    if launcher.is_container:
        return f"image tag {image_tag_version(launcher.prefix)} ({launcher.prefix[-1]})"
    found = next((v for d in (dist, f"{dist}-cpu") if (v := launcher_version(launcher, d))), None)
    return f"{dist} {found or 'not installed'} for {launcher.prefix[0]}"


def _vllm(adapter: Any, d: DryRun) -> None:
    d.version = [f"expects vLLM {image_tag_version(['', IMAGES['vllm']])} (the version the adapter is tested "
                 f"against: .venv-vllm, {IMAGES['vllm']}); {_found(adapter, 'vllm')}",
                 "read back: GET /version"]
    py = venv_python(_launcher_python(adapter), "vllm", ".venv-vllm")
    d.checks += own_code_checks("vllm", py, "vllm_check.py", d.launch.server_args if d.launch else [], d.requests)


def _sglang(adapter: Any, d: DryRun) -> None:
    row = adapter.launch_row()
    d.version = [f"row {row.span()} (checked: {', '.join(row.checked)}); {_found(adapter, 'sglang')}",
                 "read back: GET /server_info version (refused when no row covers it)"]
    vocab = None
    try:
        vocab = json.loads((Path(adapter.model) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        pass
    py = venv_python(_launcher_python(adapter), "sglang", ".venv-sglang")
    d.checks += own_code_checks("sglang", py, "sglang_check.py", d.launch.server_args if d.launch else [],
                                d.requests, {"vocab_size": vocab})


def _trtllm(adapter: Any, d: DryRun) -> None:
    VERSIONS = adapter.VERSIONS
    f = facts("trtllm")
    said = f["reported_version"]["value"]
    d.version = [f"row {VERSIONS.known()}; {_found(adapter, 'tensorrt_llm')}; the {f['tag']} server reports "
                 f"{said!r} (tensorrt_llm.__version__)", f"read back: {short(f['reported_version']['route'])}"]
    try:
        VERSIONS.row(said)
    except Exception as e:  # noqa: BLE001 - a refusal is the finding
        d.checks.append(Check(False, f"version {said!r}", f"tensorrt_llm/version.py@{f['tag']}", str(e)))
    if d.launch is not None:
        d.checks += check_flags(d.launch.server_args, f["serve_flags"]["options"], 1,
                                f"tensorrt_llm/commands/serve.py@{f['tag']} (the tag's generated trtllm-serve docs)")
        for path, text in d.launch.files.items():
            d.checks += _trtllm_options(json.loads(text), f)
    req = f["requests"]
    for label, route, body in d.requests:
        model = req.get(route)
        if model is None:
            d.checks.append(Check(False, f"route {route}", short(f["routes"]["source"]), "not a route of trtllm-serve"))
            continue
        where = f"{route} ({model['model']})"
        d.checks += check_fields(where, body, model["fields"] + list(model.get("aliases", {})),
                                 f"openai_protocol.py near {f['tag']}", True)
        d.checks += check_fields(f"{route} stream_options", body.get("stream_options") or {},
                                 req["stream_options"]["fields"], f"openai_protocol.py near {f['tag']}", True)


def _trtllm_options(opts: dict[str, Any], f: dict[str, Any]) -> list[Check]:
    """The options file against the LLM-API argument models (extra="forbid") and the dtypes."""
    args, src = f["llm_args"], f"llm_args.py@{f['tag']}"
    out = check_fields("the options file (TorchLlmArgs)", opts, args["pytorch"], src, True)
    out += check_fields("the options file's kv_cache_config (KvCacheConfig)", opts.get("kv_cache_config") or {},
                        args["kv_cache_config"], src, True)
    dtype, ok = opts.get("dtype"), f["dtypes"]["supported"]
    out.append(Check(dtype in ok, f"dtype {dtype}", f"{src}; NVIDIA/TensorRT-LLM#5260",
                     "" if dtype in ok else f"TensorRT-LLM's kernels support {', '.join(ok)} only"))
    return out


def _tgi(adapter: Any, d: DryRun) -> None:
    VERSIONS = adapter.VERSIONS
    f = facts("tgi")
    tag = adapter.image_tag() if adapter.server is not None else None
    release = tag or image_tag_version(["", IMAGES["tgi"]])
    said = f["tags"].get(f"v{release}", {}).get("reports")
    cargo = f"Cargo.toml@v{release}"
    d.version = [f"row {VERSIONS.known()}; {_found(adapter, 'tgi') if tag else 'no image tag: the pin ' + release}; "
                 f"the v{release} server reports {said!r} ({cargo})",
                 "read back: GET /info version (and sha); an image tag is trusted over it"]
    try:
        VERSIONS.row(said, tag)
    except Exception as e:  # noqa: BLE001 - a refusal is the finding
        d.checks.append(Check(False, f"version {said!r} of v{release}", cargo, str(e)))
    flags = f["launcher_flags"].get(f"v{release}") or f["launcher_flags"]["v3.3.7"]
    if d.launch is not None:
        d.checks += check_flags(d.launch.server_args, flags["options"], 0, flags["source"])
        env = {**d.launch.env, **dict(a.split("=", 1) for a, b in zip(d.launch.argv[1:], d.launch.argv)
                                      if b == "-e" and "=" in a)}
        if "PREFIX_CACHING" in env:  # the one switch of a uniform feature; PROMETHEUS_PORT may go unread
            said_env = f["launcher_env_not_flags"]["PREFIX_CACHING"].get(f"v{release}", "")
            ok = not said_env.startswith("not read")
            d.checks.append(Check(ok, f"environment PREFIX_CACHING={env['PREFIX_CACHING']}", f"v{release} source",
                                  "" if ok else said_env))
    model = f["requests"]["POST / (compat_generate)"].get(f"v{release}") or \
        f["requests"]["POST / (compat_generate)"]["v3.3.7"]
    for label, route, body in d.requests:
        d.checks += check_fields("POST / (CompatGenerateRequest)", body, model["request_fields"], model["source"],
                                 model["deny_unknown_fields"])
        d.checks += check_fields("POST / parameters (GenerateParameters)", body.get("parameters") or {},
                                 model["parameters_fields"], model["source"], model["deny_unknown_fields"])


CHECKS = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm, "tgi": _tgi}
