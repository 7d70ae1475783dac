"""Before any cell runs: every alive node tells what it has, and any difference from the driver fails the run in
one line naming the node.

Checked: the project commit (`git rev-parse HEAD`, "-dirty" included, where the project sits on the node), Python's
and Ray's versions, the versions of the harness's own packages and of the run's engines' packages (their specs
name them), each engine's version where `inferlab list-engines` finds it (its own venv included), each cell's model
directory (present, or made there from the config's `make_model`), and the ports
the config pins (`[engine_options.X] port`), free on the node. A node reports its facts from a task pinned to it
(`NodeAffinitySchedulingStrategy`, no CPU asked, so a busy node answers too).
"""
from __future__ import annotations

import os
import platform
import socket
from importlib import metadata
from pathlib import Path
from typing import Any

HARNESS = ("inferlab", "torch", "tokenizers", "numpy", "pydantic")


def engines(cfgs: list[Any]) -> list[str]:
    """The registered engines the run uses (variants by their adapter)."""
    return sorted({c.adapter(e) for c in cfgs for e in c.all_engines()})


def packages(cfgs: list[Any]) -> list[str]:
    """The distributions whose versions must match: the harness's and those of every engine the run names."""
    from adapters import registry

    names = list(HARNESS)
    for c in cfgs:
        for e in c.all_engines():
            spec = registry.spec(c.adapter(e))
            names += list(spec.packages) if spec else []
    return list(dict.fromkeys(names))


def wants(cfgs: list[Any]) -> dict[str, Any]:
    """What every node is asked about: packages, models (path -> whether the node may make it), pinned ports."""
    models = {str(c.model): c.make_model is not None for c in cfgs}
    ports = sorted({int(o["port"]) for c in cfgs for o in c.engine_options.values() if o.get("port")})
    return {"packages": packages(cfgs), "engines": engines(cfgs), "models": models, "ports": ports}


def facts(want: dict[str, Any], cwd: str) -> dict[str, Any]:
    """This node's answers (runs on the node, from the driver's working directory where it exists there)."""
    import ray

    from adapters import registry
    from experiments.running.results import git_commit

    here = Path(cwd) if Path(cwd).is_dir() else Path.cwd()
    vers = {}
    for p in want["packages"]:
        try:
            vers[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            vers[p] = None
    models = {m: "present" if (here / m / "config.json").is_file() else ("made there" if makes else "missing")
              for m, makes in want["models"].items()}
    return {"node_id": ray.get_runtime_context().get_node_id(), "hostname": socket.gethostname(),
            "commit": git_commit(Path(__file__).resolve().parent), "python": platform.python_version(),
            "ray": ray.__version__, "packages": vers, "models": models,
            "engines": {e: engine_version(registry.spec(e), here) for e in want.get("engines", [])},
            "ports_busy": [p for p in want["ports"] if not _free(p)], "pid": os.getpid()}


def engine_version(spec: Any, root: Path) -> str | None:
    """The engine's version as `inferlab list-engines` finds it: its package in this interpreter, else in its own
    venv under the checkout (`.venv-vllm`), else the program the project builds (`locate`); None when absent."""
    from adapters.common.versions import python_package_version

    for dist in spec.packages:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    python = root / spec.venv / "bin" / "python" if spec.venv else None
    if python is not None and python.exists():
        return next((v for v in (python_package_version(str(python), d) for d in spec.packages) if v), None)
    return spec.locate()[1] if spec.locate is not None else None


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def difference(node: dict[str, Any], mine: dict[str, Any]) -> str | None:
    """The first difference between a node's facts and the driver's, as a phrase; None when it may run cells."""
    for what in ("commit", "python", "ray"):
        if node[what] != mine[what]:
            return f"{what} {node[what]}, the driver has {mine[what]}"
    for p, v in mine["packages"].items():
        if node["packages"].get(p) != v:
            return f"{p} {node['packages'].get(p) or 'not installed'}, the driver has {v or 'none'}"
    for e, v in mine.get("engines", {}).items():
        if node.get("engines", {}).get(e) != v:
            return f"engine {e} {node.get('engines', {}).get(e) or 'not installed'}, the driver has {v or 'none'}"
    missing = [m for m, s in node["models"].items() if s == "missing"]
    if missing:
        return f"model directory {missing[0]} missing (no make_model in the config to make it there)"
    if node["ports_busy"]:
        return f"port {node['ports_busy'][0]} (pinned in engine_options) is in use"
    return None


def check(cfgs: list[Any], cwd: str) -> tuple[list[dict[str, Any]], str | None]:
    """Ask every alive node; returns (every node's facts, the first failure as one line, or None). The driver's own
    facts come first in the list: each task checks its node against them again (`again`), for a node that joined
    after this check (a replacement for a dead one)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    want = wants(cfgs)
    mine = facts(want, cwd)
    remote = ray.remote(num_cpus=0, max_retries=0)(facts)
    alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    refs = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(want, cwd)
            for n in alive]
    answers = [{**mine, "want": want}]
    for node_id, ref in zip(alive, refs):
        try:
            answers.append(ray.get(ref, timeout=120))
        except Exception as e:  # a node that cannot even run the check
            return answers, f"preflight: node {node_id[:12]}: could not run the check ({type(e).__name__}: " \
                            f"{' '.join(str(e).split())[:200]})"
    for a in answers[1:]:
        why = difference(a, mine)
        if why:
            return answers, f"preflight: node {a['node_id'][:12]} ({a['hostname']}): {why}"
    return answers, None


def again(expected: dict[str, Any], cwd: str) -> None:
    """In a task, before its engine starts: this node against the driver's facts; raises with the one line."""
    node = facts(expected["want"], cwd)
    why = difference(node, expected)
    if why:
        raise RuntimeError(f"preflight: node {node['node_id'][:12]} ({node['hostname']}): {why}")
