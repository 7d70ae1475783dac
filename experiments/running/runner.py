"""Drives one engine at a time through every load level of a config: start, per level
(reset prefix cache, warm-up, measured requests), stop.

Invariants: engines never overlap (one `asyncio.run` per engine, stopped before the next
starts); warm-up requests are never written to requests.jsonl; the first failed request
stops that engine's run, which is then marked failed with the reason and can be
completed with `--resume` (only requests missing from the JSONL are sent again).
"""
from __future__ import annotations

import asyncio
import math
import os
import resource
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adapters import registry
from adapters.base import Engine, EngineInfo, EngineUnavailable
from experiments.measuring.memory import MemorySampler
from experiments.measuring.observer import Bracket, LoopWatch, Timeline
from experiments.measuring import energy
from experiments.running import clock, sched, search, sweep
from experiments.running.isolate import Isolated
from experiments.running.load import LoadGenerator, Outcome, arrivals, chains
from experiments.running.progress import Progress
from experiments.running.results import EngineDir, devices, git_commit, hardware, record, versions
from experiments.workload.config import Config
from experiments.workload.workloads import WorkItem


@dataclass
class Plan:
    cfg: Config
    run_dir: Path
    items: list[WorkItem]
    warm: list[WorkItem]
    peak: dict[str, Any]  # measured copy bandwidth (experiments/measuring/bandwidth.py)
    resume: bool = False
    compute: dict[str, Any] = field(default_factory=dict)  # measured matmul ceiling (experiments/measuring/ceilings.py)
    progress: Progress = field(default_factory=lambda: Progress(False))
    meter: Any = None  # the device's energy counter (experiments/measuring/energy.py), None where none reads
    # on a cluster (experiments/cluster/task.py): each finished request's record, and each level that ended with no
    # failure (repeat, level, manifest), also go to these, to be streamed to the driver; None locally
    on_record: Any = None
    on_level: Any = None
    clients: Any = None  # `[load] clients` on a cluster: sends an open-loop level's arrivals from K processes
    _grown: dict[int, list[WorkItem]] = field(default_factory=dict)

    def items_for(self, n: int) -> list[WorkItem]:
        """The measured items, or, for a level that sends n > their chains, the workload built with
        num_requests = n (the same kind, seed and lengths; fresh prompts, so no level's extra
        requests hit the prefix cache by repeating one). Built once per n."""
        if n <= len(chains(self.items)):
            return self.items
        if n not in self._grown:
            from experiments.workload import workloads

            w = self.cfg.workload.model_copy(update={"num_requests": n})
            self._grown[n] = workloads.build(self.cfg.model, w, 0)[0]
        return self._grown[n]


def build_engine(cfg: Config, name: str, engine_dir: Path,
                 max_model_len: int | None = None) -> tuple[Engine, dict[str, Any], bool]:
    """The adapter with the config's options; the KV budget, the run's max_model_len
    (experiments/workload/context.py) and a server log path are offered too and dropped if this
    adapter rejects them. Returns (engine, options, kv_pinned).
    A ValueError about the user's own options propagates (a config error)."""
    adapter = cfg.adapter(name)  # a variant ("vllm-nocache") runs its adapter with its own options
    opts = {k: v for k, v in cfg.engine_options.get(name, {}).items() if k != "adapter"}
    spec = opts.get("speculative_config")
    if isinstance(spec, dict) and spec.get("model") and Path(spec["model"]).exists():
        # a draft model folder, absolute: a server may run from another working directory
        opts["speculative_config"] = {**spec, "model": str(Path(spec["model"]).resolve())}
    if cfg.parallel is not None and "parallel" not in opts:  # not offered: an engine that cannot is a config error
        opts["parallel"] = cfg.parallel.model_dump()
    offered: dict[str, Any] = {}
    if cfg.kv.tokens is not None and "kv_cache_tokens" not in opts:
        offered["kv_cache_tokens"] = cfg.kv.tokens
    if max_model_len is not None and not {"max_model_len", "max_seq_len", "max_total_tokens"} & set(opts):
        offered["max_model_len"] = max_model_len  # an engine's own length option wins
    if "max_num_seqs" not in opts:  # the most streams it will see: for an engine sized for them at launch
        offered["max_concurrency"] = cfg.load.most_streams(max(cfg.workload.num_requests, cfg.load.warmup))
    if opts.get("mode", "server") != "in_process" and "log_path" not in opts:
        offered["log_path"] = str((engine_dir / "server.log").resolve())
    model = str(Path(cfg.model).resolve())  # absolute: a server may run from another working directory
    while True:
        try:
            engine = registry.create(adapter, model, cfg.dtype, {**opts, **offered})  # validates the options either way
            if name in cfg.isolate or (engine.in_process and name not in cfg.same_interpreter):
                # the same class, built again in a child process, with the options it was built from
                engine = Isolated(registry.target(engine), model, cfg.dtype, {**opts, **offered})
            return engine, {**opts, **offered}, \
                cfg.kv.tokens is not None and ("kv_cache_tokens" in offered or "kv_cache_tokens" in opts)
        except ValueError as e:
            said = str(e).split("; known:")[0]  # check_options lists every known option after this
            rejected = [k for k in offered if k in said]
            if not rejected:
                raise
            for k in rejected:
                offered.pop(k)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class EngineRun:
    """One repeat of one engine: start, every level, stop. The manifest is the engine's
    (shared by its repeats): `repeats[r]` holds this repeat's status and sessions, and
    `levels[level][r]` what was measured."""

    def __init__(self, plan: Plan, name: str, repeat: int, previous: dict[str, Any] | None):
        self.plan, self.name, self.repeat = plan, name, repeat
        self.dir = EngineDir(plan.run_dir, name)
        self.manifest: dict[str, Any] = previous or {}
        self.rep: dict[str, Any] = self.manifest.setdefault("repeats", {}).setdefault(str(repeat), {})
        self.session = self.rep.get("sessions", 0) + 1
        self.done = self.dir.done_ids(repeat) if plan.resume else {}
        self.last_records: list[dict[str, Any]] = []  # the latest level's finished records

    def _save(self) -> None:
        reps = self.manifest.get("repeats", {})
        worst = next((r for r in reps.values() if r.get("status") in ("failed", "running", "unavailable")), None)
        self.manifest["status"] = worst["status"] if worst else "ok"
        self.manifest["reason"] = worst.get("reason") if worst else None
        self.dir.write("manifest.json", self.manifest)

    def _end(self, status: str, reason: str | None = None) -> str:
        self.rep.update(status=status, reason=reason)
        self._save()
        return status

    async def run(self, engine: Engine, options: dict[str, Any], kv_pinned: bool) -> str:
        cfg, m = self.plan.cfg, self.manifest
        m.update(engine=self.name, options=options, kv_pinned=kv_pinned, config_hash=cfg.digest(),
                 git_commit=git_commit(), packages=versions(), hardware=hardware(), peak_bandwidth=self.plan.peak,
                 compute_peak=self.plan.compute,
                 command=" ".join(["inferlab", *sys.argv[1:]]) if sys.argv[0].endswith("inferlab") else None)
        m.setdefault("started_at", _now())
        m.setdefault("levels", {})
        self.rep.update(status="running", reason=None, sessions=self.session, started_at=_now())
        self._save()
        try:
            info = await engine.start()
        except EngineUnavailable as e:
            return self._end("unavailable", str(e))
        except Exception as e:  # the engine could not start: a failed run, with why
            await _quiet_stop(engine)
            # the engine's own one-line error (vLLM's ValueError) where its log has one, not a traceback's tail
            why = getattr(e, "headline", None) or f"{type(e).__name__}: {e}"
            return self._end("failed", f"start failed: {why}")
        m["info"] = self.rep["info"] = info.to_dict()
        m["devices"] = devices(info, m["hardware"])  # what a frontier's "per device" divides by
        # An attached server's process is unknown (pid None) but it is not ours.
        m["same_process"] = info.pid == os.getpid() or (info.pid is None and info.mode == "in_process")
        m["scheduler"] = sched.placement(info.pid, options.get("url") if info.mode == "attach" else None)
        if info.mode == "attach" or "kv_cache_tokens" in info.unhonoured:
            m["kv_pinned"] = False  # we did not size its KV cache, or it could not take the size we gave
        self._save()
        # RSS of the engine's process tree; nothing for an attached server (never the harness's own RSS)
        pid = info.pid if info.pid is not None else (os.getpid() if m["same_process"] else None)
        sampler = MemorySampler(pid).start()
        if not cfg.observer.server_view:
            info.metrics_url = None  # the user asked for no scrapes at all
        cpu0 = _cpu_s()
        try:
            mode = {"search": search.levels, "sweep": sweep.levels}.get(cfg.load.mode)
            levels = mode(self, engine, info, sampler) if mode else _fixed(self, engine, info, sampler, cfg.load.levels())
            async for failure in levels:
                if failure:
                    return self._end("failed", failure)
            return self._end("ok")
        finally:
            self.rep["memory_after"] = await _memory_after(engine)
            await asyncio.to_thread(sampler.stop)
            sampler.frame().to_csv(self.dir.path / f"memory-r{self.repeat}-s{self.session}.csv", index=False)
            self.rep["finished_at"] = m["finished_at"] = _now()
            self.rep["harness_cpu_s"] = self.rep.get("harness_cpu_s", 0.0) + _cpu_s() - cpu0
            m["harness_process_cpu_s"] = _cpu_s()  # the whole harness process so far, imports included
            self._save()
            self.dir.close()
            await _quiet_stop(engine)

    async def _level(self, engine: Engine, info: EngineInfo, sampler: MemorySampler, kind: str,
                     value: float, items: list[WorkItem] | None = None, until_s: float | None = None,
                     more: Any = None) -> str | None:
        """Warm-up, then the bracket's before-reading, the measured requests (`items`, else the plan's; a closed
        loop with `until_s` goes on with `more(n)` fresh chains until then) with nothing else sent to the engine
        (unless a timeline is configured), and the after-reading. The device's energy counter, where there is
        one, is read just before and just after the measured requests."""
        cfg, plan = self.plan.cfg, self.plan
        level = f"{kind}={value:g}"
        done = self.done.get(level, set())
        todo = [c for c in (list(filter(lambda it: it.request_id not in done, ch))
                            for ch in chains(items or plan.items)) if c]
        if not todo:
            return None
        sampling = cfg.sampling.model_dump()
        await engine.reset_prefix_cache()
        warm = LoadGenerator(engine, sampling, lambda o: None, cfg.load.timeout_s)
        await warm.closed([[w] for w in plan.warm], int(value) if kind == "concurrency" else len(plan.warm) or 1)
        if warm.failure:
            return f"warm-up failed: {warm.failure}"
        sampler.refresh()
        bracket = Bracket(engine, info)
        await bracket.open()
        timeline = None
        if cfg.observer.timeline_s:
            timeline = Timeline(engine, info, asyncio.get_running_loop(), cfg.observer.timeline_s)
        start_idx = sampler.now()
        sampler.timeline = timeline
        rep = f" (repeat {self.repeat})" if cfg.repeats > 1 else ""
        plan.progress.level(f"{self.name} {level}{rep}", sum(len(c) for c in todo), until_s)

        self.last_records = []

        def keep(rec: dict[str, Any]) -> None:
            self.dir.append(rec)
            self.last_records.append(rec)
            plan.progress.done(len(rec["output_token_ids"]))
            if plan.on_record is not None:
                plan.on_record(rec)

        def on_done(o: Outcome) -> None:
            if o.ok:
                keep(record(o, level, self.session, self.repeat))

        gen = LoadGenerator(engine, sampling, on_done, cfg.load.timeout_s)
        sent = sum(len(c) for c in todo)
        watch = LoopWatch().start()  # whose stall a burst was (observer.bunched)
        meter = self.plan.meter
        e0 = meter.read() if meter else None
        tree0 = sampler.cpu()
        cpu0, loop0, t0 = _cpu_s(), time.thread_time(), clock.now_s()
        clients_failure = None
        try:
            if kind == "concurrency":
                await gen.closed(todo, int(value), until_s, more)
            else:
                cap = cfg.load.max_concurrency if math.isfinite(value) else None  # "inf": all at once
                offsets = arrivals(len(todo), value, cfg.load.burstiness, cfg.load.seed)
                if plan.clients is not None:  # K client processes on a cluster (experiments/cluster/clients.py)
                    clients_failure = await plan.clients(self, engine, todo, offsets, cap, keep, level)
                else:
                    await gen.open(todo, offsets, cap)
        finally:
            sampler.timeline = None
            if timeline is not None:
                timeline.close()
            loop = await watch.stop()
        wall, cpu, loop_cpu = clock.now_s() - t0, _cpu_s() - cpu0, time.thread_time() - loop0
        tree1 = sampler.cpu()
        e1 = meter.read() if meter else None
        if until_s is not None:  # a sustained level sent as many as fit in its time
            sent = gen.sent
        sampler.now()
        memory = sampler.summary(start_idx)
        observed = await bracket.close(sent)
        prev = self.manifest["levels"].setdefault(level, {}).get(str(self.repeat), {})
        self.manifest["levels"][level][str(self.repeat)] = {
            "harness_cpu_s": prev.get("harness_cpu_s", 0.0) + cpu,
            "harness_loop_cpu_s": prev.get("harness_loop_cpu_s", 0.0) + loop_cpu,
            "wall_s": prev.get("wall_s", 0.0) + wall,
            "engine_cpu": engine_cpu(tree0, tree1, prev.get("engine_cpu")),
            "sent": prev.get("sent", 0) + sent,
            "memory": _with_bracket(memory, observed),
            "observer": {"timeline": timeline.summary() if timeline else None, "loop": loop,
                         "snapshot_before": observed.get("snapshot_before"),
                         "snapshot_after": observed.get("snapshot_after")},
            "server_view": observed.get("server_view"),
            "energy": ({**meter.describe(), "joules": prev.get("energy", {}).get("joules", 0.0) + meter.used(e0, e1)}
                       if e0 is not None and e1 is not None else {"source": energy.NOT_REPORTED}),
        }
        self._save()
        failure = gen.failure or clients_failure
        if plan.on_level is not None and failure is None:
            plan.on_level(self.repeat, level, self.manifest)
        return failure


def engine_cpu(before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]],
               prev: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each engine process's CPU seconds over a level (after - before; a process that started during the
    level counts from 0), added to `prev` (the same level's earlier part, resumed) by pid."""
    out = {d["pid"]: dict(d) for d in prev or []}
    for pid, a in after.items():
        d = out.setdefault(pid, {"pid": pid, "name": a["name"], "root": a["root"], "harness": a["harness"],
                                 "cpu_s": 0.0})
        d["cpu_s"] += a["cpu_s"] - (before.get(pid) or {}).get("cpu_s", 0.0)
    return list(out.values())


def _with_bracket(memory: dict[str, Any], observed: dict[str, Any]) -> dict[str, Any]:
    """KV capacity and the engine's gauges from the readings around the level, where the
    timeline (off by default) gave none."""
    after = observed.get("snapshot_after") or {}
    before = observed.get("snapshot_before") or {}
    if memory.get("kv_capacity_tokens") is None:
        memory["kv_capacity_tokens"] = after.get("kv_capacity_tokens") or before.get("kv_capacity_tokens")
    memory["kv_usage_before"], memory["kv_usage_after"] = before.get("kv_usage"), after.get("kv_usage")
    return memory


async def _memory_after(engine: Engine) -> dict[str, int]:
    """The engine's memory report after its last level ({} when it says nothing or is gone)."""
    try:
        return await asyncio.wait_for(engine.memory(), timeout=10)
    except Exception:  # a crashed engine: the start-time report stays the only one
        return {}


async def _quiet_stop(engine: Engine) -> None:
    try:
        await asyncio.wait_for(engine.stop(), timeout=60)
    except Exception:  # stopping a dead engine may fail; the run's status already says why
        pass


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


async def _fixed(er: EngineRun, engine: Engine, info: EngineInfo, sampler: MemorySampler,
                 levels: list[tuple[str, float]]):
    """The config's own levels, in order; yields each level's failure (None when it passed)."""
    for kind, value in levels:
        yield await er._level(engine, info, sampler, kind, value)


def run_engine(plan: Plan, name: str, engine: Engine, options: dict[str, Any], kv_pinned: bool,
               repeat: int = 1) -> str:
    """Run one repeat of one engine through all levels; returns its status
    (ok | failed | unavailable | skipped)."""
    ed = EngineDir(plan.run_dir, name)
    if repeat == 1 and not plan.resume and ed.path.exists():
        shutil.rmtree(ed.path)  # a fresh run: this engine's folder starts empty
    prev = ed.read("manifest.json")
    if plan.resume and prev and (prev.get("repeats") or {}).get(str(repeat), {}).get("status") == "ok":
        return "skipped"
    er = EngineRun(plan, name, repeat, prev)
    return clock.run(er.run(engine, options, kv_pinned))
