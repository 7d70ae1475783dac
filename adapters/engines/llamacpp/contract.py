"""llama.cpp's dry-run checks: the launch through the built binary's own `--help` (every flag it lists, the
values its enumerated flags allow, integers where it says N), and the /completion body's fields against
the request schema recorded from its source (tools/server/server-schema.cpp @ b11312; `prompt` is read by
server-common.cpp's tokenize_input_prompts, which takes token ids)."""
from __future__ import annotations

from typing import Any

from adapters.checks.dryrun import Check, DryRun
from adapters.engines.llamacpp import settings

SCHEMA = "tools/server/server-schema.cpp @ b11312 (0c1e57098)"
FIELDS = frozenset({"prompt", "n_predict", "stream", "return_tokens", "ignore_eos", "cache_prompt", "temperature",
                    "top_p", "top_k", "min_p", "seed", "stop"})
READS = ("GET /props: build_info, total_slots, the per-slot n_ctx, default sampling",
         "the startup log: threads, n_ctx / n_ctx_seq / n_seq_max, n_batch / n_ubatch, flash_attn, kv_unified, "
         "KV size and type, model and compute buffer sizes",
         "each response's timings.cache_n (prompt tokens reused; /metrics has no such counter)")


def check(adapter: Any, d: DryRun) -> None:
    path = settings.binary()
    found = settings.version(path) if path else None
    d.version = [f"expects llama.cpp b{settings.BUILD} ({settings.COMMIT}: llama-cpp-python 0.3.36's vendored source, "
                 f"make llamacpp; image {settings.IMAGE}); "
                 + (f"{path} reports b{found[0]} ({found[1]})" if found else f"not built here ({adapter.INSTALL})"),
                 "read back: GET /props build_info"]
    if found and found != (settings.BUILD, settings.COMMIT):
        d.checks.append(Check(False, "version", f"{path} --version", f"b{found[0]} ({found[1]}), the adapter is "
                              f"checked against b{settings.BUILD} ({settings.COMMIT})"))
    if d.launch is not None and not (adapter.server and adapter.server.launcher.is_container):
        source = f"{path} --help" if path else "llama-server --help"
        if path is None:
            d.checks.append(Check(None, "launch flags", source, "llama-server is not built here (make llamacpp)"))
        else:
            flags = settings.parse_help(settings.help_text(path))
            for ok, what, why in settings.check_args(d.launch.server_args, flags):
                d.checks.append(Check(ok, what, source, why))
    for label, route, body in d.requests:
        unknown = sorted(set(body) - FIELDS)
        d.checks.append(Check(not unknown, f"fields of {route} ({label})", SCHEMA,
                              f"not in its schema: {', '.join(unknown)}" if unknown else ""))
