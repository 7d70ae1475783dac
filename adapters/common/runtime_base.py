"""The memory split's "interpreter and libraries" (`EngineInfo.memory["runtime_base"]`, bytes), measured on CPU.

An engine whose own process can read it (the reference engine's core, the HF baseline) reads its RSS
before any weight is loaded (`rss`). For a server whose processes we cannot stop before their weights
load (vLLM), `probe` starts the server's interpreter once, imports the modules each of its processes
imports, and reads each process's RSS: the first process imports the first group; each later one is
forked from the one before (as vLLM's engine core is forked from its API server) and imports its own
group on top. The sum is the tree's interpreter and libraries. `cached` keeps the figure per engine,
version and interpreter in the inferlab cache (`runtime_base.json`): importing vLLM takes 20-50 s.
`INFERLAB_RUNTIME_PROBE=0` turns the figure off (the split then shows a dash).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


# The engine's RSS readers, imported when first called: importing an adapter must not import torch
# (the reference_engine package does), tests/adapters/test_registry.py.
def rss() -> int | None:
    from reference_engine import rss as read
    return read()


def peak_rss() -> int | None:
    from reference_engine import peak_rss as read
    return read()


def reset_peak_rss() -> bool:
    from reference_engine import reset_peak_rss as reset
    return reset()


PROBE = r"""
import importlib, json, os, sys

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

out = []
for i, mods in enumerate(json.loads(sys.argv[1])):
    if i:  # a later process is forked from the one before, as the engine forks its own
        r, w = os.pipe()
        if os.fork():
            os.close(w)
            out.append(int(os.read(r, 64)))
            os.wait()
            continue
        os.close(r)
    for m in mods:
        importlib.import_module(m)
    if i:
        os.write(w, str(rss()).encode())
        os._exit(0)
    out.append(rss())
print(json.dumps(out))
"""


def probe(python: str, stages: list[list[str]], timeout_s: float = 300) -> list[int]:
    """RSS (bytes) of each process of the probe described above, in order. RuntimeError if it fails."""
    p = subprocess.run([python, "-c", PROBE, json.dumps(stages)], capture_output=True, text=True,
                       timeout=timeout_s, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if p.returncode != 0:
        raise RuntimeError(f"runtime probe failed: {p.stderr.strip().splitlines()[-1:] or p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def cache_file() -> Path:
    base = os.environ.get("INFERLAB_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "inferlab"
    return Path(base) / "runtime_base.json"


def cached(engine: str, version: str, python: str, stages: list[list[str]]) -> tuple[int, str] | None:
    """(bytes, what was measured) for this engine, version and interpreter: probed once, then read back.
    None when `INFERLAB_RUNTIME_PROBE=0` (cached or not: the tests' setting) or the probe fails (a dash,
    never a guess)."""
    if os.environ.get("INFERLAB_RUNTIME_PROBE") == "0":
        return None
    key = f"{engine} {version} {python} {json.dumps(stages)}"
    path = cache_file()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        try:
            known[key] = probe(python, stages)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError):
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(known, indent=1))
    each = known[key]
    what = " + ".join(f"{b / 2**20:.0f} MiB ({', '.join(m)})" for b, m in zip(each, stages))
    return sum(each), (f"RSS of {python} after importing, per process (each later one forked from the one "
                       f"before): {what}; measured once for {engine} {version}, cached in {path}")
