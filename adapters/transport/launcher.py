"""Start an engine's server as a subprocess, wait for health, and stop its whole tree.

Invariants:
- A `ServerProcess` runs in a process group of its own, so `stop()` reaches every
  worker the engine forks; after `stop()` returns, no process of the tree is alive
  (checked with psutil), or `stop()` raised saying which survived.
- It stays in the harness's session. Linux with autogroup scheduling (the default) gives
  each session an equal share of the CPUs; a server in a session of its own starved the
  client for 0.1-0.6 s at a time on 2 cores (docs/perf/2026-12-01-autogroup.md).
- Everything the server prints goes to one log file; start failures quote its tail.
- `Launcher` turns an engine's "python module / console script + flags" into an argv
  for one of three launch kinds: a python interpreter (the harness's own, or a venv's),
  or a docker/podman command line that ends with the image.
"""
from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from adapters.base import EngineUnavailable
from adapters.checks.dryrun import mounted

CONTAINER_TOOLS = ("docker", "podman")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def holds_port(pid: int, port: int) -> bool | None:
    """Whether process `pid` or one of its children listens on TCP `port`; None where psutil may not
    look. A port from `free_port()` is free only until somebody binds it: another server started in
    that gap answers /health on it while ours fails to bind, so health alone does not prove the
    server is ours."""
    try:
        root = psutil.Process(pid)
        for p in (root, *root.children(recursive=True)):
            for c in p.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
                    return True
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return None
    return False


class ServerStartError(RuntimeError):
    """The server exited or never became healthy; the message ends with its log tail.
    `headline`: the engine's own one-line error from its log (e.g. vLLM's ValueError), if any."""

    def __init__(self, message: str, headline: str | None = None):
        super().__init__(message)
        self.headline = headline


# `ValueError: ...`, `torch.OutOfMemoryError: ...`, after an optional `(EngineCore_DP0 pid=1)` prefix
_ERROR_LINE = re.compile(r"^(?:\([^)]*\)\s*)?((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception)): (\S.*)$")


def engine_error(log: str) -> str | None:
    """The first `SomeError: message` line of a server log: the root cause. A server that dies at start
    prints its engine's exception first and its own wrappers after (vLLM: "RuntimeError: Engine core
    initialization failed. See root cause above")."""
    for line in log.splitlines():
        m = _ERROR_LINE.match(line.strip())
        if m:
            return f"{m.group(1)}: {m.group(2).strip()}"
    return None


class ServerProcess:
    """One server subprocess: `await start(timeout_s)`, `.pid`, `await stop()`, `log_tail(n)`.

    `env` holds overrides applied on top of `os.environ` (None = inherit unchanged).
    `stop_argv`, when given, is run first at stop (e.g. `docker stop NAME`, because
    killing the docker client does not stop its container).
    """

    def __init__(self, argv: list[str], env: dict | None, log_path: Path, health_url: str,
                 cwd=None, stop_argv: list[str] | None = None):
        if not argv:
            raise ValueError("ServerProcess: argv is empty")
        self.argv = [str(a) for a in argv]
        self.env = {**os.environ, **{k: str(v) for k, v in (env or {}).items()}}
        self.log_path = Path(log_path)
        self.health_url = health_url
        self.cwd = cwd
        self.stop_argv = stop_argv
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None  # seconds from spawn to healthy

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(lines[-n:])

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    async def start(self, timeout_s: float = 300.0) -> None:
        """Spawn and poll `health_url` until it answers 200; raise ServerStartError otherwise."""
        if self.proc is not None:
            raise RuntimeError("ServerProcess.start() called twice")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"$ {shlex.join(self.argv)}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             process_group=0)  # own group, same session (see top)
            except FileNotFoundError as e:
                raise EngineUnavailable(f"cannot launch {self.argv[0]!r}: {e.strerror}") from e
        deadline = t0 + timeout_s
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise ServerStartError(f"server exited with code {code} before becoming healthy "
                                           f"({self.health_url}); log {self.log_path}:\n{self.log_tail()}",
                                           engine_error(self.log_text()))
                try:
                    if (await client.get(self.health_url)).status_code == 200 and self._ours():
                        self.start_s = time.monotonic() - t0
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    tail = self.log_tail()
                    await self.stop()
                    raise ServerStartError(f"server not healthy at {self.health_url} after {timeout_s:.0f} s; "
                                           f"log {self.log_path}:\n{tail}", engine_error(self.log_text()))
                await asyncio.sleep(0.25)

    def _ours(self) -> bool:
        """The answer came from this server's tree, not from another that took the port first (then
        ours fails to bind and exits, and the loop above reports its log). A container's port is
        held by the runtime's proxy, outside the tree: not checked."""
        port = httpx.URL(self.health_url).port
        if self.stop_argv or port is None:
            return True
        return holds_port(self.proc.pid, port) is not False

    def _tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    async def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM the process group, wait, SIGKILL stragglers; raise if any process survives."""
        if self.proc is None:
            return
        if self.stop_argv:
            await asyncio.to_thread(subprocess.run, self.stop_argv, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, timeout=timeout_s + 15)
        # Collect workers before signalling: they may leave the group or be reparented.
        # The root is waited on through Popen (psutil would reap it and lose its exit code).
        workers = self._tree()[1:]
        _signal_group(self.proc.pid, signal.SIGTERM)
        for p in workers:
            _signal(p, signal.SIGTERM)
        t0 = time.monotonic()
        root_done = await asyncio.to_thread(_wait, self.proc, timeout_s)
        _, alive = await asyncio.to_thread(psutil.wait_procs, workers, max(0.1, timeout_s - (time.monotonic() - t0)))
        if not root_done or alive:
            _signal_group(self.proc.pid, signal.SIGKILL)
            for p in alive:
                _signal(p, signal.SIGKILL)
            await asyncio.to_thread(_wait, self.proc, 5)
            _, alive = await asyncio.to_thread(psutil.wait_procs, alive, 5)
        alive = [p for p in alive if _alive(p)] + ([] if self.proc.poll() is not None else [self.proc])
        if alive:
            raise RuntimeError(f"processes survived SIGKILL: {[p.pid for p in alive]}")


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    try:
        proc.wait(timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(p: psutil.Process, sig: int) -> None:
    try:
        p.send_signal(sig)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class Launcher:
    """How an engine server is started.

    - kind "python": `prefix` is an interpreter; modules run as `PY -m MODULE`, console
      scripts are looked up next to the interpreter (a venv's bin/), then on PATH.
    - kind "container": `prefix` is a docker/podman command line ending with the image
      (use `--network host`, or publish `{port}`). `{port}` and `{model}` placeholders are
      filled in. A `--name` is added so that stop can `docker stop` the container, and every
      path in `mounts` (the model folder, the work dir the adapter writes its option files
      into) is mounted at the same path unless the prefix already mounts it: a file the
      adapter wrote must be visible where the server reads it.
    """

    kind: str
    prefix: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, spec: str | list[str] | None, installed: bool = True) -> "Launcher":
        """None → this interpreter; a venv dir or python path → that; `docker ...`/`podman ...` → container.
        `installed=False` (a dry run) skips the checks that the tool or interpreter exists here."""
        if spec is None or spec == "" or spec == []:
            return cls("python", [sys.executable])
        parts = shlex.split(spec) if isinstance(spec, str) else [str(s) for s in spec]
        if Path(parts[0]).name in CONTAINER_TOOLS:
            if len(parts) < 3 or parts[1] != "run":
                raise ValueError(f"container launcher must look like '{parts[0]} run [OPTIONS] IMAGE', got {spec!r}")
            if installed and shutil.which(parts[0]) is None:
                raise EngineUnavailable(f"launcher {parts[0]!r} not found on PATH; install {parts[0]} "
                                        f"or choose a python/venv launcher")
            return cls("container", parts)
        if len(parts) != 1:
            raise ValueError(f"launcher {spec!r}: expected a venv folder, a python interpreter, "
                             f"or a 'docker run ... IMAGE' / 'podman run ... IMAGE' command line")
        # absolute() but not resolve(): a venv's bin/python is a symlink that must stay one
        # (resolving it would run the base interpreter outside the venv); the server runs in
        # its work dir, so a relative path would not resolve there.
        path = Path(parts[0]).expanduser().absolute()
        if path.is_dir():
            path = path / "bin" / "python"
        if installed and not path.exists():
            raise EngineUnavailable(f"launcher interpreter {path} does not exist (create the venv, "
                                    f"e.g. scripts/setup_vllm_venv.sh for vLLM)")
        return cls("python", [str(path)])

    @property
    def is_container(self) -> bool:
        return self.kind == "container"

    def argv(self, *, args: list[str], module: str | None = None, script: str | None = None,
             container_cmd: list[str] | None = None, port: int | None = None,
             model: str | None = None, name: str | None = None, mounts: list[str] = ()) -> list[str]:
        """The full command line. `container_cmd` goes between the image and `args`
        (empty when the image's entrypoint already is the server)."""
        args = [str(a) for a in args]
        if self.is_container:
            fill = {"port": port or "", "model": model or ""}
            pre = [p.format(**fill) if "{" in p else p for p in self.prefix]
            extra = [a for m in mounts if not mounted(pre, str(m)) for a in ("-v", f"{m}:{m}")]
            pre[2:2] = (["--name", name] if name and "--name" not in pre else []) + extra
            return [*pre, *(container_cmd or []), *args]
        python = self.prefix[0]
        if module:
            return [python, "-m", module, *args]
        if not script:
            raise ValueError("Launcher.argv needs a module or a script")
        return [self.find_script(script), *args]

    def find_script(self, script: str) -> str:
        local = Path(self.prefix[0]).parent / script
        if local.exists():
            return str(local)
        found = shutil.which(script)
        if found is None:
            raise EngineUnavailable(f"{script!r} not found next to {self.prefix[0]} or on PATH")
        return found

    def stop_argv(self, name: str | None) -> list[str] | None:
        """`docker stop NAME` for containers (killing the client leaves the container running)."""
        if not self.is_container or not name:
            return None
        return [self.prefix[0], "stop", "-t", "10", name]
