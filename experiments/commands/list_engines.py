"""`inferlab list-engines`: for each registered engine, whether it can run here and now.

What is looked for comes from each engine's spec (adapters/engines/<name>/__init__.py), never from here.

Per engine: where it was found (this interpreter, the project's venv for it, a command on PATH,
its pinned container image), the version found, whether it needs a GPU and whether this machine
has one, whether a server already answers at its usual local address, and the one command that
installs or starts it. Nothing here imports torch or an engine package (the probes run the
interpreters and commands themselves), so the command answers in about a second.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

from adapters import registry
from adapters.common.versions import python_package_version
from adapters.registry import EngineSpec

REPO = Path(__file__).resolve().parents[2]
MODEL = "models/tiny"  # what the image commands start (make-model writes it)


def command(spec: EngineSpec) -> str:
    """The one command that installs (or, for an engine served from its image, starts) the engine."""
    if spec.install or not spec.image:
        return spec.install
    return f"docker run --gpus all --ipc host --network host -v $PWD/{MODEL}:/model {spec.image} {spec.container_cmd}"


def gpu_here() -> str | None:
    """The first GPU `nvidia-smi -L` lists (None: no NVIDIA GPU or no driver)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def installed(spec: EngineSpec) -> tuple[str | None, str | None]:
    """(where, version) of the engine's package or command, or (None, None)."""
    if spec.packages == ("inferlab",):
        return "this checkout", _dist_version(spec.packages)
    module = spec.packages[0] if spec.packages else None
    if module and importlib.util.find_spec(module) is not None:
        return "this interpreter", _dist_version(spec.packages)
    python = REPO / spec.venv / "bin" / "python" if spec.venv else None
    if python is not None and python.exists():
        versions = (python_package_version(str(python), d) for d in spec.packages)
        return spec.venv, next((v for v in versions if v), None)
    if spec.locate is not None and spec.locate()[0]:
        return spec.locate()
    if spec.script and shutil.which(spec.script):
        return shutil.which(spec.script), None
    return None, None


def _dist_version(dists: tuple[str, ...]) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def answers(probe: tuple[str, str] | None, timeout_s: float = 0.5) -> str | None:
    """'URL (version X)' when a server answers the probe route, else None."""
    if probe is None:
        return None
    url = probe[0] + probe[1]
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = json.loads(resp.read() or b"{}")
    except (OSError, ValueError):
        return None
    version = body.get("version") if isinstance(body, dict) else None
    return probe[0] + (f" (version {version})" if version else "")


def status(spec: EngineSpec, gpu: str | None) -> dict[str, str]:
    name = spec.name
    where, version = installed(spec)
    server = answers(spec.probe)
    code_only = where == spec.venv and where is not None and not spec.venv_serves
    if spec.gpu and gpu is None:
        here = "no: needs a CUDA GPU, none here" + (f" ({where}: its code, for contract tests)" if code_only else "")
    elif code_only and not server:
        here = f"no: {where} holds its code only (contract tests); serve it from its image"
    elif spec.attach_only:
        here = "yes, a server answers" if server else f"no: no server answers at {spec.probe[0]}"
    elif where or server:
        here = "yes" + (f" ({where})" if where else "") + (", a server answers" if server else "")
    else:
        here = "no: not installed"
    ready = bool(where) and not code_only and not (spec.gpu and gpu is None) and spec.start
    return {"engine": name, "here": here, "version": version or "-",
            "gpu": ("needed" if spec.gpu else "not needed") + f"; here: {gpu or 'none'}",
            "server": server or f"none answering at {spec.probe[0]}" if spec.probe else "in-process",
            "command": spec.start if ready else command(spec)}


def table() -> list[dict[str, str]]:
    gpu = gpu_here()
    return [status(spec, gpu) for spec in registry.specs()]


def render(rows: list[dict[str, str]]) -> str:
    out = []
    for r in rows:
        out.append(f"{r['engine']:<10} can run here: {r['here']}")
        out.append(f"{'':<10} version {r['version']} · GPU {r['gpu']} · server {r['server']}")
        out.append(f"{'':<10} $ {r['command']}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    from experiments.commands.run import fail

    if argv:
        return fail("list-engines takes no arguments")
    print(render(table()))
    print("\nbefore any GPU time: `inferlab run CONFIG --dry-run` prints each engine's launch command, version, "
          "first requests, metrics and settings read back, checked against upstream (exit 2 on a failed check)")
    return 0
