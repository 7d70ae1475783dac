"""What each (cell, engine) task asks Ray for, and which alive nodes could give it (the dry run's placement).

A GPU engine (its spec says so), or a cell with `[cluster] gpus = true`, asks for tensor x pipeline GPUs (the
config's `[parallel]`; data-parallel replicas are the engine's own processes on those GPUs); any other asks for
`[cluster] cpus` CPUs. `[cluster] accelerator` adds Ray's accelerator kind (`accelerator_type`, which Ray turns
into the resource `accelerator_type:KIND`), and `[cluster] resources` custom resources a node was started with.
"""
from __future__ import annotations

from typing import Any


def ask(cfg: Any, engine: str) -> dict[str, Any]:
    """Ray task options for one engine of one cell: num_cpus, num_gpus, resources (accelerator_type folded in)."""
    from adapters import registry

    spec = registry.spec(cfg.adapter(engine))
    gpu = cfg.cluster.gpus if cfg.cluster.gpus is not None else bool(spec and spec.gpu)
    par = cfg.parallel
    n = (par.tensor * par.pipeline) if par is not None else 1
    resources = dict(cfg.cluster.resources)
    if cfg.cluster.accelerator:
        resources[f"accelerator_type:{cfg.cluster.accelerator}"] = 0.001  # what Ray's accelerator_type asks
    return {"num_cpus": 0 if gpu else cfg.cluster.cpus, "num_gpus": n if gpu else 0, "resources": resources}


def needs(opts: dict[str, Any]) -> dict[str, float]:
    """The options as one resource table, Ray's own names (CPU, GPU, custom)."""
    out = {"CPU": float(opts["num_cpus"]), "GPU": float(opts["num_gpus"]), **opts["resources"]}
    return {k: v for k, v in out.items() if v}


def fits(need: dict[str, float], total: dict[str, float]) -> bool:
    return all(total.get(k, 0.0) >= v for k, v in need.items())


def describe(need: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in need.items()) or "nothing"


def plan(pairs: list[tuple[str, str, dict[str, Any]]], nodes: list[dict[str, Any]]) -> tuple[list[str], str | None]:
    """The dry run's table: per (cell, engine, task options) the nodes whose total resources hold what it asks
    (Ray picks one of them when it runs); the first pair no node can hold fails it, in one line."""
    alive = [n for n in nodes if n.get("Alive")]
    lines = [f"cluster: {len(alive)} alive node(s): " + "; ".join(
        f"{n['NodeID'][:12]} ({n.get('NodeManagerHostname', '?')}: {describe(_own(n['Resources']))})" for n in alive)]
    for cell, engine, opts in pairs:
        need = needs(opts)
        where = [n for n in alive if fits(need, n.get("Resources") or {})]
        if not where:
            return lines, (f"cell {cell}, engine {engine}: no node has what it asks ({describe(need)}); "
                           f"{len(alive)} node(s) alive")
        lines.append(f"  {cell} / {engine}: asks {describe(need)} -> "
                     + ", ".join(f"{n['NodeID'][:12]} ({n.get('NodeManagerHostname', '?')})" for n in where))
    return lines, None


def _own(res: dict[str, float]) -> dict[str, float]:
    """A node's resources without Ray's bookkeeping ones (memory, node:IP, object store)."""
    return {k: v for k, v in res.items() if not k.startswith(("node:", "memory", "object_store_memory"))}
