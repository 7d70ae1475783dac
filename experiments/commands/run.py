"""`inferlab run` (routed here by experiments/cli.py), and the conventions every command shares
(`Parser`: argparse's errors as one line; `fail`: one line and exit code 2).

Exit codes: 0 all engines ok; 1 an engine failed mid-run (see its manifest's reason;
`--resume` completes it); 2 a config/usage problem or a required engine is not installed
(one line on stderr saying what to fix).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from experiments.workload.config import ConfigError, load


class Parser(argparse.ArgumentParser):
    def __init__(self, **kw) -> None:
        super().__init__(allow_abbrev=False, **kw)

    def error(self, message: str) -> None:  # argparse's own usage errors: one line, exit 2
        print(f"inferlab {self.prog.split()[-1]}: {message}", file=sys.stderr)
        sys.exit(2)


def fail(msg: str) -> int:
    """A command's error: one line on stderr, exit code 2 (every inferlab command's convention)."""
    print(f"inferlab: {msg}", file=sys.stderr)
    return 2


def ensure_model(cfg) -> None:
    """Make the config's model directory (`make_model` table) unless it is there already."""
    mm = cfg.make_model
    if mm is None:
        return
    from reference_engine.model.gguf import REAL_PRESETS, make_real_model
    from reference_engine.model.make import make_model, truncate

    if mm.preset in REAL_PRESETS and not Path(cfg.model).is_dir():  # a real model (cached conversion)
        print(f"inferlab: making model {cfg.model} ({mm.preset}, {cfg.dtype})", file=sys.stderr)
        make_real_model(cfg.model, mm.preset, cfg.dtype)
    elif not Path(cfg.model).is_dir():
        print(f"inferlab: making model {cfg.model} ({mm.family}, {mm.preset}"
              + (f", cycles of {mm.cycle} tokens" if mm.cycle else "") + ")", file=sys.stderr)
        make_model(cfg.model, preset=mm.preset, family=mm.family, seed=mm.seed, cycle=mm.cycle)
    draft = Path(f"{cfg.model}-draft")
    if mm.draft_layers and not draft.is_dir():
        print(f"inferlab: making draft model {draft} (the first {mm.draft_layers} layer(s))", file=sys.stderr)
        truncate(cfg.model, draft, mm.draft_layers)


def run_main(argv: list[str]) -> int:
    p = Parser(prog="inferlab run", description="run an experiment config and write results/<name>/report.md")
    p.add_argument("config")
    p.add_argument("--engine", help="run only this engine (overrides the config's engine list); the other "
                                    "engines' folders in the run are kept, so the report still compares them")
    p.add_argument("--cell", action="append", metavar="NAME", help="a matrix config: run only this cell (repeatable); "
                                                                   "the other cells' folders are kept in the page")
    p.add_argument("--resume", action="store_true", help="send only the requests missing from requests.jsonl")
    p.add_argument("--out", default="results", help="results root (default: results)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="start nothing: print each engine's launch command, "
                   "version, first request bodies, metrics and settings read back, each checked against upstream; "
                   "exit 2 if a check fails")
    p.add_argument("--cluster", metavar="ADDRESS", help="run each (cell, engine) pair as a task on this Ray cluster "
                   "(auto: RAY_ADDRESS); overrides [cluster] address (experiments/cluster/)")
    a = p.parse_args(argv)
    try:
        cfg = load(a.config, engine=a.engine)
        whole = load(a.config) if a.engine else cfg  # what config.json records: the whole comparison
    except ConfigError as e:
        return fail(str(e))
    toml = Path(a.config).read_text()
    if a.cluster or cfg.cluster.address:  # only here is Ray imported
        from experiments.cluster import driver

        if a.cell and not cfg.cells:
            return fail(f"{a.config}: --cell needs a matrix config ([[cells]])")
        a.make_model = ensure_model
        return driver.run(cfg, whole, toml, a, a.cluster or cfg.cluster.address)
    if any(c.load.clients for c in cfg.cell_configs() or [cfg]):
        return fail(f"{a.config}: load.clients: K client processes need a Ray cluster (--cluster ADDRESS)")
    if not cfg.cells:
        return fail(f"{a.config}: --cell needs a matrix config ([[cells]])") if a.cell else \
            _run(cfg, whole, toml, Path(a.out), a)
    unknown = set(a.cell or []) - {c["name"] for c in cfg.cells}
    if unknown:
        return fail(f"{a.config}: no cell named {', '.join(sorted(unknown))} "
                     f"(cells: {', '.join(c['name'] for c in cfg.cells)})")
    from experiments.report import matrix

    codes = []
    for cell, cell_whole in zip(cfg.cell_configs(), whole.cell_configs()):
        if a.cell and cell.name not in a.cell:
            continue
        print(f"inferlab: cell {cell.name}", file=sys.stderr)
        head = f"# cell {cell.name!r} of the matrix config {a.config} (its [[cells]] entry merged into the rest)\n"
        codes.append(_run(cell, cell_whole, head + toml, Path(a.out) / cfg.name, a))
        if codes[-1] == 2:
            return 2
    if a.dry_run:  # started nothing, so writes nothing: the page and the cells' summaries stay as they are
        return max(codes)
    root = Path(a.out) / cfg.name
    # the whole matrix, for `inferlab report ROOT` (json.dumps: a rate of inf stays a number, Infinity)
    (root / "matrix.json").write_text(json.dumps(whole.model_dump(mode="python"), indent=2, default=str))
    report = matrix.build(root, whole, command=f"inferlab run {a.config}")
    print(f"inferlab: matrix report written to {report}", file=sys.stderr)
    return max(codes)


def _run(cfg, whole, toml: str, out: Path, a: argparse.Namespace) -> int:
    """Run one config (a plain one, or one cell of a matrix) into out/<cfg.name>/."""
    from experiments.measuring import bandwidth, ceilings, energy
    from experiments.report import build
    from experiments.running import search
    from experiments.running.progress import Progress
    from experiments.running.runner import Plan, build_engine, run_engine
    from experiments.workload import context, workloads

    try:
        ensure_model(cfg)
        items, warm = workloads.build(cfg.model, cfg.workload, cfg.load.warmup)
        max_model_len = context.choose(cfg, search.sized(cfg, items) + warm, workloads.context_len(cfg.model))
        context.check_kv(cfg, max_model_len)  # before any engine spends minutes starting
    except (ValueError, OSError) as e:
        return fail(f"{a.config}: {e}")
    run_dir = out / cfg.name
    engines = {}
    for name in cfg.all_engines():  # every adapter validates its options before anything runs
        try:
            engines[name] = build_engine(cfg, name, run_dir / name, max_model_len)
        except (ValueError, TypeError) as e:
            return fail(f"{a.config}: engine_options.{name}: {e}")
    if a.dry_run:
        from experiments.commands.dry_run import dry_run

        return dry_run(cfg, engines, items)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(toml)
    # the run folder describes the whole comparison; `--engine` only refreshes one column of it
    (run_dir / "config.json").write_text(whole.model_dump_json(indent=2))
    # what was sent: kind, template, length distributions, and for real text its sources and Python version
    (run_dir / "workload.json").write_text(json.dumps(workloads.describe(items, cfg.workload), indent=2))
    plan = Plan(cfg, run_dir, items, warm, bandwidth.peak_copy_gbps(), resume=a.resume,
                compute=ceilings.compute_peak(str(cfg.model), cfg.dtype),
                progress=Progress(False if a.no_progress else None), meter=energy.meter())
    statuses: dict[str, str] = {}
    ran = False
    # SIGTERM unwinds like Ctrl-C, so every started engine (and its server tree) is stopped
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main else None
    try:
        with plan.progress:
            for name, repeat in interleaved(list(engines), cfg.repeats):
                if statuses.get(name) == "unavailable":
                    continue  # not installed: no point asking again next repeat
                if repeat > 1:  # a fresh adapter per repeat: each start is a cold start
                    engines[name] = build_engine(cfg, name, run_dir / name, max_model_len)
                if ran:  # the previous engine has stopped: read the machine's bandwidth again
                    plan.peak = bandwidth.best_of(plan.peak, bandwidth.peak_copy_gbps())
                ran = True
                status = run_engine(plan, name, *engines[name], repeat=repeat)
                if statuses.get(name) in (None, "ok", "skipped"):
                    statuses[name] = status
                why = _reason(run_dir, name)
                rep = f" repeat {repeat}" if cfg.repeats > 1 else ""
                plan.progress.note(f"{name}{rep}: {status}" + (f" ({why})" if why else ""))
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        _share_peak(run_dir, list(engines), plan.peak)
    report = build([run_dir], run_dir)
    print(f"inferlab: report written to {report}", file=sys.stderr)
    missing = [n for n, s in statuses.items() if s == "unavailable" and n in cfg.engine_list()]
    if missing:
        return fail("; ".join(_reason(run_dir, n) or f"engine {n!r} is not available" for n in missing))
    return 1 if "failed" in statuses.values() else 0


def _share_peak(run_dir: Path, names: list[str], peak: dict[str, Any]) -> None:
    """Every engine's manifest gets the run's best bandwidth reading (`bandwidth.best_of`), so each
    engine's TPOT is divided by the same floor, whichever reading was taken before it ran."""
    from experiments.measuring import bandwidth

    for name in names:
        path = run_dir / name / "manifest.json"
        try:
            m = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # never started
        old = m.get("peak_bandwidth") or {}
        seen = old.get("readings") or [old.get("cpu_gbps")]
        mine = old and seen != (peak.get("readings") or [peak.get("cpu_gbps")])[:len(seen)]  # an earlier invocation's
        m["peak_bandwidth"] = bandwidth.best_of(old, peak) if mine else peak
        path.write_text(json.dumps(m, indent=2))


def interleaved(engines: list[str], repeats: int) -> list[tuple[str, int]]:
    """(engine, repeat) in run order: A B A B ..., so drift over time hits every engine alike."""
    return [(name, r) for r in range(1, repeats + 1) for name in engines]


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _reason(run_dir: Path, name: str) -> str:
    from experiments.running.results import EngineDir

    m = EngineDir(run_dir, name).read("manifest.json") or {}
    return " ".join(str(m.get("reason") or "").split())  # one line
