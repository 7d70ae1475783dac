"""Shared pieces of the engine adapters (vLLM, SGLang, TensorRT-LLM, TGI): server launch from
adapter options, the KV-budget conversion, lazy engine imports.

Every such adapter has up to three modes, picked by option `mode` (adapters/registry.py `create`):
- "server" (default): launch the engine's own server through `options.launcher`
  (this interpreter, a venv folder, a python path, or `docker run ... IMAGE`);
- "attach": talk to `options.url`, a server someone else started (setting `url` alone
  implies attach);
- "in_process": the engine's Python API in the harness's interpreter (offline
  throughput only: the load generator shares the interpreter lock with the engine).

Invariants: constructing an adapter never imports an engine package and never
launches anything; a missing package or launcher surfaces at `start()` as
`EngineUnavailable` naming what to install; unknown options are a ValueError at
construction (the harness reports it as a config error).
"""
from __future__ import annotations

import importlib
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from adapters.base import Engine, EngineUnavailable, GenerationRequest, MemorySnapshot, check_options
from adapters.checks.dryrun import LaunchPlan
from adapters.common import model_shape
from adapters.registry import SERVER_OPTIONS
from adapters.transport.launcher import Launcher, ServerProcess, free_port


class ManagedServer:
    """The engine server an adapter launched from its options (mode "server").

    Options used: launcher, host (default 127.0.0.1), port (default: a free one),
    log_path (default WORK/server.log), work_dir (default: a fresh temp folder; the
    engine's caches and temp files go here), startup_timeout_s (default 600),
    extra_args (a list or a shell-quoted string appended to the command line), env
    (extra environment variables).
    """

    def __init__(self, engine: str, model: str, options: dict[str, Any], health_path: str,
                 install: str = "install the engine's package for that launcher"):
        self.engine = engine
        self.model = model
        self.install = install  # what to do when the launcher lacks the engine
        self.options = options
        self.health_path = health_path
        self.host = str(options.get("host", "127.0.0.1"))
        self.port: int | None = options.get("port")
        self.timeout_s = float(options.get("startup_timeout_s", 600))
        extra = options.get("extra_args") or []
        self.extra_args = shlex.split(extra) if isinstance(extra, str) else [str(a) for a in extra]
        self.launcher: Launcher | None = None
        self.proc: ServerProcess | None = None
        self.work_dir: Path | None = None
        self._alias: Path | None = None  # short symlink to WORK/tmp, removed at stop
        self._installed = True  # False while a dry run plans the launch
        self._args: list[str] = []  # the engine's own arguments, as the last argv() built them
        self._missing: str | None = None

    @property
    def model_arg(self) -> str:
        """The model as the server must see it: an absolute path when it is a local folder
        (the server runs in `work_dir`, so a relative path would not resolve)."""
        p = Path(self.model)
        return str(p.resolve()) if p.exists() else self.model

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _work_dir(self, create: bool = True) -> Path:
        if self.options.get("work_dir"):
            d = Path(self.options["work_dir"])
        elif self.options.get("log_path"):
            d = Path(self.options["log_path"]).parent / f"{self.engine}-work"
        elif create:
            d = Path(tempfile.mkdtemp(prefix=f"inferlab-{self.engine}-"))
        else:
            d = Path(tempfile.gettempdir()) / f"inferlab-{self.engine}-XXXXXXXX"  # made at start
        if create:
            d.mkdir(parents=True, exist_ok=True)
        return d.absolute()

    def plan(self, argv_for: Callable[[], list[str]], env_for: Callable[[Path | None], dict[str, str]],
             files_for: Callable[[], dict[str, str]] = dict, installed: bool = True,
             launcher: str | None = None) -> LaunchPlan:
        """The launch, decided and not started: launcher, port, work dir, command line (with the
        container's mounts and environment), and the files the adapter writes before it starts.
        `installed=False` (a dry run) neither needs the launcher here nor creates anything.
        `argv_for()` gives the command line without extra_args (built with `self.argv`, valid once
        launcher, port and work dir are set); `env_for(work_dir or None)` its environment (None for
        containers: host paths mean nothing inside them); `files_for()` {path: text}."""
        self._installed, self._missing = installed, None
        try:
            self.launcher = Launcher.parse(launcher or self.options.get("launcher"), installed)
        except EngineUnavailable as e:
            raise EngineUnavailable(f"engine {self.engine!r}: {e}; {self.install}") from None
        self.port = int(self.port or free_port())
        self.work_dir = self._work_dir(create=installed)
        log_path = Path(self.options.get("log_path") or self.work_dir / "server.log")
        env = {**env_for(None if self.launcher.is_container else self.work_dir),
               **{k: str(v) for k, v in (self.options.get("env") or {}).items()}}
        argv = argv_for() + self.extra_args
        name = None
        if self.launcher.is_container:
            name = f"inferlab-{self.engine}-{self.port}"
            argv[2:2] = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
            env = {}
        return LaunchPlan(argv, env, files_for(), self.work_dir, log_path, self.port,
                          self.launcher.stop_argv(name), self._args + self.extra_args, self._missing)

    async def start(self, argv_for: Callable[[], list[str]],
                    env_for: Callable[[Path | None], dict[str, str]],
                    files_for: Callable[[], dict[str, str]] = dict) -> str:
        """Launch (`plan()`, then write its files) and wait for health; return the base URL."""
        plan = self.plan(argv_for, env_for, files_for)
        for path, text in plan.files.items():
            Path(path).write_text(text)
        env = plan.env if self.launcher.is_container else {"TMPDIR": self._tmp_alias(), **plan.env}
        self.proc = ServerProcess(plan.argv, env, plan.log_path, self.base_url + self.health_path,
                                  cwd=self.work_dir, stop_argv=plan.stop_argv)
        try:
            await self.proc.start(self.timeout_s)
        except BaseException:
            await self.stop()
            raise
        return self.base_url

    def argv(self, *, args: list[str], module: str | None = None, script: str | None = None,
             container_cmd: list[str] | None = None) -> list[str]:
        """`Launcher.argv` with this server's port and container name filled in, and the model
        folder and work dir mounted into a container; raises EngineUnavailable when the
        launcher's interpreter lacks the module or script (`installed=False`: the name is kept)."""
        installed, self._args = self._installed, [str(a) for a in args]
        if module and not self.launcher.is_container:
            try:
                self._check_module(module.split(".")[0])
            except EngineUnavailable as e:
                if installed:
                    raise
                self._missing = str(e)
        model = Path(self.model_arg)
        mounts = [str(p) for p in (self.work_dir, model) if p is not None and Path(p).is_absolute()]
        try:
            return self.launcher.argv(args=args, module=module, script=script, container_cmd=container_cmd,
                                      port=self.port, model=self.model_arg,
                                      name=f"inferlab-{self.engine}-{self.port}", mounts=mounts)
        except EngineUnavailable as e:
            if not installed and script:  # a dry run shows the program by name
                self._missing = f"{script!r} is not installed here"
                return [script, *[str(a) for a in args]]
            raise EngineUnavailable(f"{e}; {self.install}") from None

    def _check_module(self, package: str) -> None:
        python = self.launcher.prefix[0]
        probe = subprocess.run([python, "-c", f"import importlib.util as u, sys; sys.exit(u.find_spec({package!r}) is None)"],
                               capture_output=True, timeout=60)
        if probe.returncode != 0:
            raise EngineUnavailable(f"engine {self.engine!r}: package {package!r} is not installed for {python}; "
                                    f"{self.install}")

    def log_text(self) -> str:
        return self.proc.log_text() if self.proc else ""

    def _tmp_alias(self) -> str:
        """TMPDIR for the server: WORK/tmp, reached through a short symlink in the system temp
        folder when its path is long, because engines bind unix sockets there (vLLM's ZMQ
        IPC) and a socket path may have at most 107 bytes."""
        tmp = self.work_dir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        if len(str(tmp)) <= 48:  # + "/" + a 36-char uuid + slack stays under the limit
            return str(tmp)
        self._alias = Path(tempfile.mkdtemp(prefix="il-")) / "t"
        self._alias.symlink_to(tmp, target_is_directory=True)
        return str(self._alias)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        try:
            if proc is not None:
                await proc.stop()
        finally:
            alias, self._alias = self._alias, None
            if alias is not None:
                alias.unlink(missing_ok=True)
                alias.parent.rmdir()


def kv_bytes_per_token(model_dir: str, dtype: str, tensor_parallel: int = 1) -> int:
    """K and V bytes one token occupies on one GPU (from the model's config.json; see
    adapters.common.model_shape: with tensor parallelism each GPU holds its share of the KV heads)."""
    try:
        return model_shape.kv_bytes_per_token(model_dir, dtype, tensor_parallel)
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"cannot size the KV budget from {model_dir}/config.json ({e!r}); "
                         f"set the engine's own memory knob instead of kv_cache_tokens") from e


def kv_pin_gap(asked: int | None, capacity: int | None, block_size: int | None, engine: str,
               how: str) -> str | None:
    """Why the KV budget `asked` (tokens) did not become the engine's capacity, in words, or
    None when it did (equal up to rounding down to whole blocks). `how` says what the adapter
    passed, e.g. "--max-total-tokens (an upper bound: SGLang takes the minimum with what fits)"."""
    if asked is None:
        return None
    if capacity is None:
        return f"{engine}: asked {asked} KV tokens through {how}; the capacity it ran with could not be read back"
    if 0 <= asked - capacity < max(1, block_size or 1):
        return None
    return f"{engine}: asked {asked} KV tokens through {how}; it runs with {capacity}"


def need(module: str, install: str):
    """Import an engine package, or raise EngineUnavailable naming what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EngineUnavailable(f"{module} is not importable here ({e}); {install}") from e


async def aclose_then(client: Any, then: Callable[[], Any], *more: Any) -> None:
    """Close an HTTP client and any `more` (None: nothing to close), then await `then()` even if
    closing failed."""
    try:
        for c in (client, *more):
            if c is not None:
                await c.aclose()
    finally:
        await then()


class HeldEngine(Engine):
    """An in-process adapter whose engine object (`self.engine`) has a sync `shutdown()`;
    `snapshot()` reports only the time (these engines' Python APIs expose no KV gauges)."""

    engine: Any = None
    in_process = True

    async def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(t_ns=time.perf_counter_ns())

    async def stop(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()


class LaunchedServer:
    """The one base of every adapter that talks to an engine's own server (vLLM, SGLang,
    TensorRT-LLM, TGI, `inferlab serve`): mixed in before the protocol class (e.g.
    `class VLLMServer(LaunchedServer, OpenAIEngine)`, `class TGIServer(LaunchedServer, Engine)`).

    With option `url` it attaches (mode "attach"); otherwise `self.server` is a
    `ManagedServer` built from the launch options (mode "server"), started by `connect()` and
    stopped by `disconnect()`. Subclasses give `server_argv()` and, if needed, `server_env()`,
    `INSTALL` (what to install when the launcher lacks the engine) and `HEALTH_PATH`.
    """

    OPTIONS: frozenset[str] | set[str] = SERVER_OPTIONS | {"url"}
    MODES = ("server", "attach")
    INSTALL = ""
    HEALTH_PATH = "/health"

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        self.url: str | None = self.options.get("url")
        self.server = (None if self.url else
                       ManagedServer(self.name, model, self.options, self.HEALTH_PATH, self.INSTALL))

    @property
    def mode(self) -> str:
        return "attach" if self.url else "server"

    @property
    def pid(self) -> int | None:
        return self.server.pid if self.server else None

    def server_argv(self) -> list[str]:
        raise NotImplementedError

    def server_env(self, work_dir: Path | None) -> dict[str, str]:
        return {}

    def server_files(self) -> dict[str, str]:
        """Files to write before the server starts ({path: text}; paths under the work dir,
        which a container launcher mounts)."""
        return {}

    def launch_plan(self, installed: bool = True, launcher: str | None = None) -> LaunchPlan | None:
        """The launch this adapter would make, started nowhere (None: attached); `launcher`
        replaces the option's (a dry run shows a missing engine through its pinned image)."""
        if self.server is None:
            return None
        return self.server.plan(self.server_argv, self.server_env, self.server_files, installed, launcher)

    def dry_run(self, requests: list[GenerationRequest], fallback_launcher: str | None = None):
        from adapters.checks.contracts import plan_launched

        return plan_launched(self, requests, fallback_launcher)

    async def connect(self) -> str:
        """The base URL: the attached one, or the launched server's once it is healthy."""
        if self.server is None:
            return str(self.url).rstrip("/").removesuffix("/v1")
        return await self.server.start(self.server_argv, self.server_env, self.server_files)

    async def disconnect(self) -> None:
        if self.server is not None:
            await self.server.stop()

    @property
    def launch_argv(self) -> list[str] | None:
        """The command line the launched server runs (None: attached)."""
        return self.server.proc.argv if self.server is not None and self.server.proc is not None else None

    def launch_knobs(self) -> dict[str, Any]:
        """Where the launched server logged and how long it took to become healthy."""
        if self.server is None or self.server.proc is None:
            return {}
        return {"log_path": str(self.server.proc.log_path), "startup_s": round(self.server.proc.start_s or 0.0, 1)}
