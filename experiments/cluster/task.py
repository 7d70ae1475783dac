"""One (cell, engine) pair on the node Ray placed it on: the existing runner, unchanged, in a node-local folder.

The engine starts here and the load is generated here, exactly as a local run does (`running/runner.py`), every
repeat of the pair one after another. Each finished request's record, and each level that ended with no failure
(with the manifest as it stood then), is put to the driver's sink as it happens (`Plan.on_record`, `on_level`);
the task returns the engine folder's other files (manifest, memory samples, server log) and where it ran. A rerun
after a node died gets the finished levels' manifest and records, and resumes past them (`Plan.resume`): the
interrupted level runs again whole. A reaper beside the task (`reaper.py`) kills the engine's process groups if
the task's process ends without stopping them.
"""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

WORST = ("unavailable", "failed", "ok", "skipped")


def node() -> dict[str, Any]:
    """Where this runs: Ray node id, hostname, IP and the device model (the first GPU's name, else the CPU's)."""
    import ray

    from experiments.running.results import hardware

    hw = hardware()
    gpus = hw.get("gpus") or []
    return {"node_id": ray.get_runtime_context().get_node_id(), "hostname": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(), "device": gpus[0]["name"] if gpus else hw.get("cpu"),
            "gpus": len(gpus), "pid": os.getpid()}


def run_pair(payload: dict[str, Any], sink: Any) -> dict[str, Any]:
    """The Ray task's body (experiments/cluster/driver.py submits it with max_retries=0)."""
    from experiments.cluster.reaper import Reaper

    from experiments.cluster import preflight

    where = node()
    sink.put.remote(payload["key"], payload["attempt"], "start", where)
    if payload.get("expect"):  # a node that joined after the run's preflight (a replacement) is checked here
        preflight.again(payload["expect"], payload["cwd"])
    reaper = Reaper.start()
    tmp = Path(tempfile.mkdtemp(prefix="inferlab-task-"))
    try:
        status, files = _run(payload, sink, tmp)
        return {"status": status, "files": files, "node": where}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        reaper.close()


def _run(payload: dict[str, Any], sink: Any, tmp: Path) -> tuple[str, dict[str, bytes]]:
    from experiments.measuring import bandwidth, ceilings, energy
    from experiments.running.progress import Progress
    from experiments.running.results import EngineDir
    from experiments.running.runner import Plan, build_engine, run_engine
    from experiments.workload import workloads
    from experiments.workload.config import Config

    if Path(payload["cwd"]).is_dir():
        os.chdir(payload["cwd"])  # the config's relative paths, as on the driver
    cfg = Config.model_validate(payload["cfg"])
    name, key, attempt = payload["engine"], payload["key"], payload["attempt"]
    payload["make_model"](cfg)  # the driver's ensure_model: a config's make_model table is made here too
    items, warm = workloads.build(cfg.model, cfg.workload, cfg.load.warmup)
    run_dir = tmp / cfg.name
    ed = EngineDir(run_dir, name)
    if payload.get("manifest"):  # a rerun: the levels another node finished, so the runner resumes past them
        ed.write("manifest.json", payload["manifest"])
        for rec in payload.get("records") or []:
            ed.append(rec)
        ed.close()

    def level(repeat: int, lvl: str, manifest: dict[str, Any]) -> None:
        sink.put.remote(key, attempt, "level", {"repeat": repeat, "level": lvl, "manifest": manifest})

    plan = Plan(cfg, run_dir, items, warm, bandwidth.peak_copy_gbps(), resume=bool(payload.get("manifest")),
                compute=ceilings.compute_peak(str(cfg.model), cfg.dtype), progress=Progress(False),
                meter=energy.meter(), on_record=lambda rec: sink.put.remote(key, attempt, "record", rec),
                on_level=level)
    per_client: dict[str, dict[str, Any]] = {}
    if cfg.load.clients:
        from experiments.cluster.clients import Clients

        plan.clients = Clients(cfg, name, lambda lvl, rep, rows: per_client.setdefault(lvl, {}).update({str(rep): rows}))
    statuses = []
    for repeat in range(1, cfg.repeats + 1):
        engine, options, kv_pinned = build_engine(cfg, name, ed.path, payload["max_model_len"])
        statuses.append(run_engine(plan, name, engine, options, kv_pinned, repeat=repeat))
        if statuses[-1] == "unavailable":
            break
    if plan.clients is not None:
        import ray

        for actor in plan.clients.actors:
            ray.kill(actor)
    if per_client:  # each level's clients: node, clock offset, lateness (experiments/cluster/clients.py)
        m = ed.read("manifest.json") or {}
        ed.write("manifest.json", {**m, "clients": per_client})
    files = {p.name: p.read_bytes() for p in ed.path.iterdir() if p.is_file() and p.name != "requests.jsonl"}
    return min(statuses, key=WORST.index), files
