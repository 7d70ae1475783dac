"""The run folder: `results/<name>/<engine>/{requests.jsonl, summary.json, manifest.json, memory.csv}`
and `results/<name>/{report.md, plots/}`.

Invariants: a request's line is written and flushed the moment it finishes, so an engine
that dies loses nothing already finished; a line is only written for a request that
finished cleanly (`finish_reason` stop/length), so `--resume` reruns exactly the others.
`manifest.json` holds `status` ("running" until the engine's levels all complete, then
"ok", or "failed" with `reason`).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from adapters import registry
from adapters.common import parallel
from experiments.running.load import Outcome

# the harness's own stack; each engine's spec adds its packages (`versions`)
PACKAGES = ("inferlab", "torch", "transformers", "tokenizers", "numpy", "pandas", "pydantic", "httpx", "aiohttp",
            "huggingface-hub")


def record(o: Outcome, level: str, session: int, repeat: int = 1) -> dict[str, Any]:
    done = o.events[-1][0] if o.events else o.send_ns
    return {"level": level, "request_id": o.item.request_id, "repeat": repeat, "session": session,
            "send_ns": o.send_ns, "due_ns": o.due_ns, "sent_ns": o.wire[0] if o.wire else None,
            "headers_ns": o.wire[1] if o.wire else None,
            "done_ns": done, "events": o.events, "prompt_token_ids": o.item.prompt_token_ids,
            "output_token_ids": o.token_ids, "output_len": o.item.output_len, "text": o.text,
            "finish_reason": o.finish_reason, "prompt_tokens_reported": o.prompt_tokens,
            "completion_tokens_reported": o.completion_tokens}


class EngineDir:
    """One engine's folder in a run."""

    def __init__(self, run_dir: str | Path, engine: str):
        self.path = Path(run_dir) / engine
        self.engine = engine
        self.path.mkdir(parents=True, exist_ok=True)
        self.requests = self.path / "requests.jsonl"
        self._fh = None

    def append(self, rec: dict[str, Any]) -> None:
        if self._fh is None:
            self._fh = open(self.requests, "a", encoding="utf-8")
        self._fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def records(self) -> list[dict[str, Any]]:
        """Every complete line (a line cut off by a crash is skipped)."""
        if not self.requests.is_file():
            return []
        out = []
        for line in self.requests.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def done_ids(self, repeat: int = 1) -> dict[str, set[str]]:
        """level -> ids of the requests this repeat already finished (what --resume skips)."""
        done: dict[str, set[str]] = {}
        for r in self.records():
            if r.get("repeat", 1) == repeat:
                done.setdefault(r["level"], set()).add(r["request_id"])
        return done

    def read(self, name: str) -> dict[str, Any] | None:
        p = self.path / name
        return json.loads(p.read_text()) if p.is_file() else None

    def write(self, name: str, data: dict[str, Any]) -> None:
        tmp = self.path / (name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str))
        os.replace(tmp, self.path / name)


def versions() -> dict[str, str]:
    out = {}
    engines = (p for spec in registry.specs() for p in spec.packages)
    for p in dict.fromkeys((*PACKAGES, *engines)):
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[dict[str, Any]]:
    try:
        import pynvml  # optional: only on GPU hosts

        pynvml.nvmlInit()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            driver = pynvml.nvmlSystemGetDriverVersion()
            out.append({"name": name.decode() if isinstance(name, bytes) else name,
                        "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                        "driver": driver.decode() if isinstance(driver, bytes) else driver})
        return out
    except Exception:  # no NVML / no GPU: an empty list says so
        return []


def devices(info: Any, hw: dict[str, Any]) -> dict[str, Any]:
    """What "per device" means for this engine's throughput: on a GPU host the GPUs it uses (tensor x pipeline
    x data, as it reports them), else the cores its process may run on (its affinity mask; an attached
    server's process is not ours, so the machine's)."""
    eff = info.effective or {}
    gpus = hw.get("gpus") or []
    if gpus and not str(eff.get("device") or "").startswith("cpu"):
        n = parallel.gpus(eff)[0] or 1
        return {"kind": "gpu", "count": n, "per": "per GPU", "model": gpus[0]["name"], "driver": gpus[0].get("driver")}
    try:
        cores = len(psutil.Process(info.pid).cpu_affinity()) if info.pid else None
    except (psutil.Error, AttributeError):
        cores = None
    where = "the engine process's affinity mask" if cores else "this machine (the engine's process is not ours)"
    cores = cores or psutil.cpu_count()
    return {"kind": "cpu", "count": cores, "per": f"per core ({where}: {cores} of {psutil.cpu_count()})",
            "model": hw.get("cpu")}


def hardware() -> dict[str, Any]:
    return {"cpu": _cpu_model(), "cores_logical": psutil.cpu_count(), "cores_physical": psutil.cpu_count(False),
            "ram_bytes": psutil.virtual_memory().total, "gpus": _gpus(), "platform": platform.platform(),
            "python": platform.python_version()}


def git_commit(cwd: str | Path | None = None) -> str | None:
    here = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if sha.returncode != 0:
        return None
    return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
