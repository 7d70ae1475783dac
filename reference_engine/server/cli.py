"""`python -m reference_engine.server MODEL_DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--max-waiting N] [engine options]`
(also `inferlab serve ...`, the same program behind the project's console script).

Binds loopback by default. SIGTERM / Ctrl-C: uvicorn stops accepting, lets in-flight
requests (streams included) finish for up to --shutdown-timeout seconds, then the engine
shuts down and the process exits 0.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import typing

from .app import DEFAULT_MAX_WAITING
from .limits import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_REQUEST_BYTES, idle_timeout_protocol


ENGINE_SKIP = ("model", "record_steps")  # the positional MODEL; per-step records are for offline analysis


def _engine_flags(group) -> None:
    """One flag per EngineConfig field (`max_num_seqs` -> `--max-num-seqs`), so new knobs appear here
    by themselves; unset flags stay None and EngineConfig's own defaults apply."""
    from reference_engine.config import EngineConfig

    hints = typing.get_type_hints(EngineConfig)
    for f in dataclasses.fields(EngineConfig):
        if f.name in ENGINE_SKIP:
            continue
        flag, kind = "--" + f.name.replace("_", "-"), hints[f.name]
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
        if base is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        elif base is dict:  # vLLM's spelling: --speculative-config '{"method": "ngram", ...}'
            group.add_argument(flag, type=json.loads, default=None, metavar="JSON", help="a JSON object")
        elif typing.get_origin(base) is list:  # vLLM's spelling: --cuda-graph-sizes 1 2 4 8
            item = typing.get_args(base)[0]
            group.add_argument(flag, type=item, nargs="*", default=None, metavar=item.__name__.upper(),
                               help="default: " + (repr(f.default) if f.default is not None else "see EngineConfig"))
        else:
            group.add_argument(flag, type=base, default=None, metavar=f.name.upper(),
                               help=f"default: {f.default!r}")


def engine_config(args: argparse.Namespace):
    from reference_engine.config import EngineConfig

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
             if f.name not in ENGINE_SKIP and getattr(args, f.name) is not None}
    # Like vLLM's CPU backend, leave one core to the HTTP front end (and a client on the same
    # machine): on 2 cores, 2 torch threads + a busy client made decode ~1.6x slower than 1 thread.
    # With tensor parallelism `num_threads` is per rank: the ranks share those cores.
    given.setdefault("num_threads", max(1, serving_threads() // given.get("tensor_parallel_size", 1)))
    return EngineConfig(model=args.model, **given)


def serving_threads() -> int:
    """Torch threads for a served engine: every usable core but one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="inferlab serve", description=__doc__.split("\n\n")[1])
    p.add_argument("model", help="HF-format model directory (config.json, model.safetensors, tokenizer.json)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("INFERLAB_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every route but /health and /metrics "
                        "(default: $INFERLAB_API_KEY, else no key)")
    p.add_argument("--max-waiting", type=int, default=DEFAULT_MAX_WAITING,
                   help="sequences allowed to wait for their first token; beyond it requests get 503")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES, metavar="BYTES",
                   help="a request body over this size gets 413 before it is parsed (default: 16 MiB)")
    p.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S, metavar="SECONDS",
                   help="close a connection that has not sent a whole request head this long after connecting "
                        "or after its last response (uvicorn's keep-alive timeout covers neither)")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients use (default: the model argument as given, as vLLM's)")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template, or a file holding one, used instead of the model's own "
                        "(chat_template.jinja, else tokenizer_config.json's chat_template), as vLLM's flag")
    p.add_argument("--shutdown-timeout", type=float, default=60.0,
                   help="seconds in-flight requests get to finish after SIGTERM")
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine core in a process of its own, as vLLM's EngineCore (default); "
                        "--no-engine-process runs it in a thread of the server's process "
                        "(docs/perf/2026-12-02-served-decode-profile.md compares the two)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    _engine_flags(p.add_argument_group("engine (EngineConfig fields; defaults are EngineConfig's)"))
    return p.parse_args(argv)


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if not os.path.isdir(args.model):
        print(f"inferlab serve: model directory {args.model!r} does not exist", file=sys.stderr)
        return 2
    import uvicorn

    from reference_engine import AsyncEngine
    from reference_engine.engine_process import ProcessAsyncEngine

    from .app import build_app

    try:
        engine = (ProcessAsyncEngine if args.engine_process else AsyncEngine)(engine_config(args))
        app = build_app(engine, api_key=args.api_key, max_waiting=args.max_waiting,
                        served_model_name=args.served_model_name, chat_template=args.chat_template,
                        max_request_bytes=args.max_request_bytes)
        http = idle_timeout_protocol(args.idle_timeout)
    except ValueError as err:
        print(f"inferlab serve: {err}", file=sys.stderr)
        return 2
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=args.shutdown_timeout, access_log=False,
                                           http=http))
    # uvicorn re-raises the signal it caught once it has shut down gracefully; make that an exit 0.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    signal.signal(signal.SIGINT, _exit_cleanly)
    try:
        server.run()
    except SystemExit as done:
        return int(done.code or 0)
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
