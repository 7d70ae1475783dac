"""`python -m reference_engine.server MODEL_DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--max-waiting N] [engine options]`
(also `inferlab serve ...`, the same program behind the project's console script).

Binds loopback by default. SIGTERM / Ctrl-C: uvicorn stops accepting, lets in-flight
requests (streams included) finish for up to --shutdown-timeout seconds, then the engine
shuts down and the process exits 0; a second signal cuts the wait short. A signal while the
model loads kills the engine core and exits 0 at once.

Exit codes: 0 stopped by a signal; 1 the engine core died (as vLLM's API server does, so a
supervisor restarts it; --keep-alive-on-engine-death serves 503s instead) or failed to start;
2 a bad argument or engine setting (one line on stderr).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
import typing

from .app import DEFAULT_MAX_WAITING
from .limits import DEFAULT_IDLE_TIMEOUT_S, DEFAULT_MAX_REQUEST_BYTES, idle_timeout_protocol


ENGINE_SKIP = ("model", "record_steps")  # the positional MODEL; per-step records are for offline analysis
# Where `inferlab serve` differs from EngineConfig's defaults, as `vllm serve` does from its engine's
# dataclass: "auto" serves a float32 checkpoint in bfloat16, as vLLM 0.32 does on x86 and Arm CPUs
# (config.resolve_dtype). EngineConfig keeps float32, the teaching engine's HF-exact default; give
# --dtype float32 for greedy tokens identical to HF's. `num_threads`: serving_threads().
SERVE_DEFAULTS = {"dtype": "auto"}


def _engine_flags(group) -> None:
    """One flag per EngineConfig field (`max_num_seqs` -> `--max-num-seqs`), so new knobs appear here
    by themselves; unset flags stay None and EngineConfig's own defaults apply, but for SERVE_DEFAULTS."""
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
                               help=f"default: {SERVE_DEFAULTS.get(f.name, f.default)!r}")


def engine_config(args: argparse.Namespace):
    from reference_engine.config import EngineConfig

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)
             if f.name not in ENGINE_SKIP and getattr(args, f.name) is not None}
    given = {**SERVE_DEFAULTS, **given}
    # With tensor parallelism `num_threads` is per rank: the ranks share those cores.
    given.setdefault("num_threads", max(1, serving_threads(args.engine_process) // given.get("tensor_parallel_size", 1)))
    return EngineConfig(model=args.model, **given)


def serving_threads(engine_process: bool = True) -> int:
    """Torch threads for a served engine. With the engine core in its own process (the default), every
    usable core: the front end only parses, detokenizes and streams, and on the 2-core machines
    `vllm bench serve` against no-flag servers measured 2 threads ahead of 1 at 1, 4 and 8 streams
    (docs/perf/2026-12-04-defaults.md). With the core in a thread of the server's process
    (--no-engine-process), every core but one, as vLLM's CPU backend leaves one: there 2 torch threads
    and a busy client made decode ~1.6x slower than 1 thread on 2 cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores if engine_process else max(1, cores - 1)


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
    p.add_argument("--data-parallel-size", type=int, default=1, metavar="N",
                   help="N engine cores, each a full copy of the model pinned to its own share of the CPUs, behind "
                        "this one server; each request goes to the one --router picks (vLLM's --data-parallel-size)")
    p.add_argument("--router", default="least_loaded", choices=["round_robin", "least_loaded", "prefix_aware"],
                   help="with --data-parallel-size > 1: which replica takes a request (reference_engine/engine/router.py, "
                        "the routers `inferlab simulate --replicas` models)")
    p.add_argument("--engine-step-timeout", type=float, default=None, metavar="SECONDS",
                   help="declare the engine core dead when it makes no step for this long while requests are "
                        "open (default: 20x the longest step seen, at least 60 s)")
    p.add_argument("--keep-alive-on-engine-death", action="store_true",
                   help="when the engine core dies, keep serving (/health and requests answer 503) instead of "
                        "exiting 1 (vLLM's VLLM_KEEP_ALIVE_ON_ENGINE_DEATH)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--explain-paths", action="store_true",
                   help="build the engine with these settings, print which code path runs each step shape "
                        "and why (reference_engine/worker/paths.py), and exit without serving")
    _engine_flags(p.add_argument_group("engine (EngineConfig fields; defaults are EngineConfig's)"))
    return p.parse_args(argv)


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)


def _say(message: str) -> None:
    print(f"inferlab serve: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if not os.path.isdir(args.model):
        _say(f"model directory {args.model!r} does not exist")
        return 2
    if args.explain_paths:
        return explain_paths(args)
    import uvicorn

    from reference_engine import AsyncEngine
    from reference_engine.engine.engine_process import ProcessAsyncEngine

    from .app import build_app

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if self.should_exit:  # a second SIGTERM ends the drain too, not only a second Ctrl-C
                self.force_exit = True
            super().handle_exit(sig, frame)

    died: list[str] = []

    def on_death(why: str) -> None:  # on the event loop
        died.append(why)
        if args.keep_alive_on_engine_death:
            _say(f"the engine core died ({why}); serving 503s (--keep-alive-on-engine-death)")
        else:
            _say(f"the engine core died ({why}); exiting 1 so that a supervisor restarts the server")
            server.should_exit = True

    try:
        cfg = engine_config(args)
        if args.data_parallel_size > 1:
            from reference_engine.engine.data_parallel import DataParallelEngine

            if not args.engine_process:
                raise ValueError("--data-parallel-size > 1 runs each replica's core in a process of its own; "
                                 "drop --no-engine-process")
            engine = DataParallelEngine(cfg, args.data_parallel_size, args.router, args.engine_step_timeout)
        elif args.data_parallel_size < 1:
            raise ValueError(f"--data-parallel-size must be >= 1, got {args.data_parallel_size}")
        else:
            engine = (ProcessAsyncEngine(cfg, step_timeout=args.engine_step_timeout) if args.engine_process
                      else AsyncEngine(cfg))
        engine.on_death = on_death
        app = build_app(engine, api_key=args.api_key, max_waiting=args.max_waiting,
                        served_model_name=args.served_model_name, chat_template=args.chat_template,
                        max_request_bytes=args.max_request_bytes)
        http = idle_timeout_protocol(args.idle_timeout)
    except ValueError as err:
        _say(str(err))
        return 2
    server = Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                   timeout_graceful_shutdown=args.shutdown_timeout, access_log=False, http=http))
    # The engine starts before uvicorn binds: a bad setting is one line and exit 2, and a signal during
    # the load kills the core at once (uvicorn would wait for its lifespan to finish starting).
    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        try:
            signals = runner.run(_start(engine))
        except ValueError as err:
            _say(str(err))
            return 2
        except Exception as err:
            _say(f"the engine failed to start: {err}")
            return 1
        if signals:  # (the start may have finished just as the signal came)
            runner.run(engine.shutdown())
            _say(f"stopped by {signal.Signals(signals[0]).name} while starting")
            return 0
        say_dtype(cfg)  # (config.json read once the engine has: a FIFO there must not block the signals above)
        # uvicorn re-raises the signal it caught once it has shut down gracefully; make that an exit 0.
        signal.signal(signal.SIGTERM, _exit_cleanly)
        signal.signal(signal.SIGINT, _exit_cleanly)
        try:
            runner.run(server.serve())
        except SystemExit as done:
            return int(done.code or 0)
        finally:
            runner.run(engine.shutdown())  # a forced exit skips the app's shutdown; idempotent otherwise
    return 1 if died or not server.started else 0


def say_dtype(cfg) -> None:
    """One line when "auto" serves the checkpoint in another dtype, as vLLM's "Downcasting" log line."""
    from reference_engine.config import ModelConfig, resolve_dtype

    if str(cfg.dtype).lower() == "auto":
        try:
            ckpt = ModelConfig.from_dir(cfg.model).torch_dtype
        except OSError:  # no config.json: the engine's start says so
            return
        got = str(resolve_dtype("auto", ckpt, cfg.device)).removeprefix("torch.")
        if got != ckpt:
            _say(f"dtype auto: the {ckpt} checkpoint is served in {got}, as vLLM does "
                 f"(--dtype {ckpt} for greedy tokens identical to HF's)")


def explain_paths(args: argparse.Namespace) -> int:
    """`--explain-paths`: the dispatch table of the engine these flags build, printed; no server."""
    from reference_engine import LLMEngine

    try:
        engine = LLMEngine(engine_config(args))
    except ValueError as err:
        _say(str(err))
        return 2
    try:
        print(engine.explain_paths())
    finally:
        engine.close()
    return 0


async def _start(engine) -> list[int]:
    """Start the engine; SIGTERM / SIGINT meanwhile abort it. Returns the signals that came."""
    from reference_engine.engine.client import StartAborted

    came: list[int] = []

    def abort(signum, frame) -> None:
        came.append(signum)
        engine.abort_start()

    before = {sig: signal.signal(sig, abort) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        await engine.start()
    except StartAborted:
        pass
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    return came


if __name__ == "__main__":
    sys.exit(main())
