"""TensorRT-LLM's dry-run checks, against the tables recorded from its source at the pinned tag
(upstream.json, each table citing file@tag; how each was read: tests/adapters/fixtures/trtllm/SOURCE.md):
the trtllm-serve flags, the LLM-API options file (TorchLlmArgs and KvCacheConfig forbid unknown
fields), the dtypes its kernels run, the request models' fields and the version its server reports."""
from __future__ import annotations

import json
from typing import Any

from adapters.checks.contracts import found
from adapters.checks.dryrun import Check, DryRun, check_fields, check_flags, facts, short

READS = ("GET /prometheus/metrics: trtllm_model_config_info (dtype as requested, max_model_len), "
         "trtllm_parallel_config_info, trtllm_speculative_config_info, trtllm_kv_cache_config_info, "
         "KV block gauges, trtllm_max_num_active_requests, trtllm_max_num_tokens_runtime",
         "chunked prefill: as requested (the options file; nothing reports it)")


def check(adapter: Any, d: DryRun) -> None:
    VERSIONS = adapter.VERSIONS
    f = facts("trtllm")
    said = f["reported_version"]["value"]
    d.version = [f"row {VERSIONS.known()}; {found(adapter, 'tensorrt_llm')}; the {f['tag']} server reports "
                 f"{said!r} (tensorrt_llm.__version__)", f"read back: {short(f['reported_version']['route'])}"]
    try:
        VERSIONS.row(said)
    except Exception as e:  # noqa: BLE001 - a refusal is the finding
        d.checks.append(Check(False, f"version {said!r}", f"tensorrt_llm/version.py@{f['tag']}", str(e)))
    if d.launch is not None:
        d.checks += check_flags(d.launch.server_args, f["serve_flags"]["options"], 1,
                                f"tensorrt_llm/commands/serve.py@{f['tag']} (the tag's generated trtllm-serve docs)")
        for path, text in d.launch.files.items():
            d.checks += options_file(json.loads(text), f)
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


def options_file(opts: dict[str, Any], f: dict[str, Any]) -> list[Check]:
    """The options file against the LLM-API argument models (extra="forbid") and the dtypes."""
    args, src = f["llm_args"], f"llm_args.py@{f['tag']}"
    out = check_fields("the options file (TorchLlmArgs)", opts, args["pytorch"], src, True)
    out += check_fields("the options file's kv_cache_config (KvCacheConfig)", opts.get("kv_cache_config") or {},
                        args["kv_cache_config"], src, True)
    dtype, ok = opts.get("dtype"), f["dtypes"]["supported"]
    out.append(Check(dtype in ok, f"dtype {dtype}", f"{src}; NVIDIA/TensorRT-LLM#5260",
                     "" if dtype in ok else f"TensorRT-LLM's kernels support {', '.join(ok)} only"))
    return out
