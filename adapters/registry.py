"""The engines: one folder each under `adapters/engines/`, found here by looking, never by a list.

An engine folder's `__init__.py` registers its adapter with one line,

    register(SPEC, VLLMServer, VLLMInProcess)      # or @register(SPEC) on the one class

where `SPEC` is the folder's `EngineSpec`: everything the harness needs to know about the engine
(block size, image, packages, colour, parallel flags, what list-engines and the dry run say). The
harness (`experiments/`) reads specs and names no engine; adding an engine is a folder and that line.

Modes: every adapter class says which modes it runs (`Engine.MODES`: "in_process"; a launched
server's "server" and "attach"). `create()` pops the config's `mode` option (default: `attach`
with a `url`, else the spec's `default_mode`), checks it, and builds the class that runs it.

Importing this module imports no engine; the first lookup imports every engine folder, and an
engine folder imports no engine package (a missing vLLM is `EngineUnavailable` at `start()`).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

from adapters.base import Engine

ENGINES_PACKAGE = "adapters.engines"
MODES = ("server", "attach", "in_process")
# Options only a launched server understands (adapters/transport/server.py's ManagedServer).
SERVER_OPTIONS = frozenset({"launcher", "host", "port", "log_path", "work_dir", "startup_timeout_s",
                            "extra_args", "env"})


@dataclass(frozen=True)
class EngineSpec:
    """What the harness knows about one engine, in one place (the engine's own folder)."""

    name: str  # what a config's `engine = "..."` says
    default_mode: str = "server"  # the mode without a `mode` option or a `url`
    # KV sizing (experiments/workload/context.py): the option that sets the block size and its default
    # (block_size None: the harness does not size this engine's KV), blocks the engine keeps out of its pool
    block_option: str | None = None
    block_size: int | None = None
    reserved_blocks: int = 0
    # [parallel] tensor / pipeline / data -> the engine's own option; a dimension missing is refused with `parallel_why`
    parallel: dict[str, str] = field(default_factory=dict)
    parallel_why: str = "no such option"
    # on a GPU host: the pinned container image, the `docker run` options it needs, what runs inside it
    image: str | None = None
    container_opts: str = ""
    container_cmd: str = ""
    # where it is found (inferlab list-engines): PyPI distributions whose version is the engine's (first found),
    # the project's venv for it, whether that venv serves it (False: its code only, for contract tests),
    # a server command on PATH, whether it needs a CUDA GPU, (base URL, route) a running server answers
    packages: tuple[str, ...] = ()
    venv: str | None = None
    venv_serves: bool = True
    script: str | None = None
    locate: Callable[[], tuple[str | None, str | None]] | None = None  # a program the project builds: (where, version)
    gpu: bool = False
    probe: tuple[str, str] | None = None
    install: str = ""  # the one command that installs it (a GPU engine: pulls and starts its image)
    start: str = ""  # ... or starts it, once installed
    attach_only: bool = False  # runs only against a server someone else started (url)
    # the report: its colour in every plot, whether it is the naive baseline, whether ratios are about it
    colour: str | None = None
    baseline: bool = False
    anchor: bool = False
    simulated: bool = False  # `inferlab simulate` steps this engine's own scheduler and KV manager
    step_timer: str | None = None  # a script, run in the engine's own interpreter, timing its steps (simulate's bench)
    metrics: Any = None  # its Prometheus names (adapters.transport.metric_names.MetricNames), None: none known
    # the dry run: the settings it reads back (and from where), and its checks against upstream
    # (`contract(adapter, dry_run)`; None: this checkout's own server, tested by its own tests)
    reads: tuple[str, ...] = ()
    contract: Callable[[Any, Any], None] | None = None


@dataclass
class Entry:
    spec: EngineSpec
    modes: dict[str, type[Engine]]  # mode -> the class that runs it


_ENGINES: dict[str, Entry] = {}
_found = False


def register(spec: EngineSpec, *classes: type[Engine]):
    """Register `classes` (each runs the modes in its `MODES`) as engine `spec.name`; with no class,
    a decorator for the one class. Sets `name` and `spec` on each class."""
    if not classes:
        return lambda cls: register(spec, cls) or cls
    modes: dict[str, type[Engine]] = {}
    for cls in classes:
        cls.name, cls.spec = spec.name, spec
        for m in cls.MODES:
            modes.setdefault(m, cls)
    if spec.default_mode not in modes:
        raise ValueError(f"engine {spec.name!r}: default mode {spec.default_mode!r} is not one of {', '.join(modes)}")
    _ENGINES[spec.name] = Entry(spec, modes)


def entries() -> dict[str, Entry]:
    """name -> Entry, every engine folder imported once (tests may add entries to this dict)."""
    global _found
    if not _found:
        _found = True
        pkg = importlib.import_module(ENGINES_PACKAGE)
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
            if info.ispkg:
                importlib.import_module(f"{ENGINES_PACKAGE}.{info.name}")
    return _ENGINES


def names() -> list[str]:
    """Every engine's name, in alphabetical order (whatever order the folders were imported in)."""
    return sorted(entries())


def entry(name: str) -> Entry:
    found = entries()
    if name not in found:
        raise KeyError(f"unknown engine {name!r}; known engines: {', '.join(found)}")
    return found[name]


def spec(name: str) -> EngineSpec | None:
    """The engine's spec; None for a name no folder registers (a variant label, a merged run's folder)."""
    e = entries().get(name)
    return e.spec if e is not None else None


def specs() -> list[EngineSpec]:
    return [entries()[n].spec for n in names()]


def pick_mode(name: str, options: dict[str, Any], supported: tuple[str, ...], default: str) -> str:
    """Pop `mode` from `options` (default: attach if `url` is set, else `default`) and check it."""
    mode = options.pop("mode", "attach" if options.get("url") and "attach" in supported else default)
    if mode not in supported:
        raise ValueError(f"engine {name!r}: mode must be one of {', '.join(supported)}, got {mode!r}")
    if mode == "attach" and not options.get("url"):
        raise ValueError(f'engine {name!r}: mode "attach" needs option url = "http://HOST:PORT"')
    if mode != "server":
        extra = sorted(set(options) & SERVER_OPTIONS)
        if extra:
            raise ValueError(f"engine {name!r}: option(s) {', '.join(extra)} need mode = \"server\"")
    if mode != "attach" and "url" in options:
        raise ValueError(f"engine {name!r}: option url needs mode = \"attach\"")
    return mode


def create(name: str, model: str, dtype: str = "float32", options: dict[str, Any] | None = None) -> Engine:
    """The adapter for `name` in the mode its options ask for (ValueError: a bad option or mode;
    KeyError: an unknown engine). Constructing starts nothing."""
    e = entry(name)
    opts = dict(options or {})
    if len(set(e.modes.values())) == 1 and "mode" not in opts:  # one class: its own options decide
        return next(iter(e.modes.values()))(model, dtype, opts)
    mode = pick_mode(name, opts, tuple(m for m in MODES if m in e.modes), e.spec.default_mode)
    return e.modes[mode](model, dtype, opts)


def target(engine: Engine) -> str:
    """"module:Class" of a built adapter, which a child process imports to build it again (experiments' isolation)."""
    cls = type(engine)
    return f"{cls.__module__}:{cls.__qualname__}"
