"""Where each engine ran, for a run on a Ray cluster (`manifest["cluster"]`, written by experiments/cluster/driver.py):
the node (Ray node id, hostname, device model), what its task asked for, and every attempt: a node lost mid-level,
which levels were kept and which reran whole elsewhere, and how many duplicate or late records were dropped.
A local run's manifests have no `cluster` entry, and its report no such section."""
from __future__ import annotations

from typing import Any

from experiments.report.md import fmt, table


def node_text(node: dict[str, Any] | None) -> str:
    if not node:
        return "–"
    return f"`{str(node.get('node_id') or '?')[:12]}` {node.get('hostname') or '?'} ({node.get('device') or '?'})"


def _attempt(a: dict[str, Any]) -> str:
    out = f"{a.get('attempt')}: {node_text(a)} -> {a.get('outcome')}"
    if a.get("levels_dropped") or a.get("levels_kept"):
        out += (f"; kept {', '.join(a.get('levels_kept') or []) or 'no level'}, reran whole "
                f"{', '.join(a.get('levels_dropped') or []) or 'nothing'}")
    return out


def section(runs: Any) -> list[str]:
    """`## Where it ran (Ray cluster)`: one row per engine; [] for a local run."""
    rows = []
    for e in runs.engines:
        c = e.manifest.get("cluster")
        if not c:
            continue
        asked = c.get("asked") or {}
        ask = ", ".join(f"{k} {v:g}" for k, v in (("CPU", asked.get("num_cpus") or 0), ("GPU", asked.get("num_gpus") or 0),
                                                   *(asked.get("resources") or {}).items()) if v)
        rows.append([e.label, node_text(c.get("node")), ask or "–", "<br>".join(_attempt(a) for a in c.get("attempts") or []),
                     f"{c.get('records', '–')} ({c.get('duplicates_dropped', 0)} duplicate, "
                     f"{c.get('late_records_dropped', 0)} late dropped)"])
    if not rows:
        return []
    return ["## Where it ran (Ray cluster)", "",
            "Each engine's levels ran as one Ray task on the node named (its engine launched there, its load sent "
            "from there); a node lost mid-level cost that level only, rerun whole on another node, so no level mixes "
            "two nodes. Records are kept once per request id.", "",
            *table(["engine", "node", "asked", "attempts", "records"], rows), "", *clients(runs)]


def clients(runs: Any) -> list[str]:
    """Per level, each client process that sent it (`[load] clients`): its node, clock offset against the task, the
    requests it sent and its lateness p99; a client over the sweep's `client_lateness_ms` is client-bound."""
    rows = []
    for e in runs.engines:
        for level, reps in (e.manifest.get("clients") or {}).items():
            for rep, cl in reps.items():
                bound = [c["client"] for c in cl if c.get("client_bound")]
                for c in cl:
                    rows.append([e.label, level, rep, f"{c['client']} of {len(cl)}", f"`{str(c.get('node_id'))[:12]}`",
                                 fmt(c.get("clock_offset_ms"), 3), fmt(c.get("rtt_ms"), 3), str(c.get("sent")),
                                 fmt(c.get("lateness_p99_ms"), 1),
                                 "**client-bound**" if c.get("client_bound") else ("no" if not bound else "no (another is)")])
    if not rows:
        return []
    return ["### The clients that sent each level", "",
            "A level's arrival schedule split over its client processes (chain i to client i mod K), started at one "
            "wall-clock time; each client's timestamps were moved onto the task's clock by its measured offset "
            "(round-trip midpoint). A client whose send lateness p99 passes `[load.sweep] client_lateness_ms` did "
            "not keep its schedule: that level measured the client, not the engine.", "",
            *table(["engine", "level", "repeat", "client", "node", "clock offset (ms)", "round trip (ms)", "sent",
                    "lateness p99 (ms)", "client-bound"], rows), ""]


def cell_nodes(runs: Any) -> str:
    """One phrase for the matrix page: which node ran each engine of a cell ('' for a local run)."""
    parts = [f"{e.label} on {node_text((e.manifest.get('cluster') or {}).get('node'))}"
             + (f" after {len(e.manifest['cluster']['attempts'])} attempts"
                if len(e.manifest["cluster"].get("attempts") or []) > 1 else "")
             for e in runs.engines if e.manifest.get("cluster")]
    return "; ran " + "; ".join(parts) if parts else ""
