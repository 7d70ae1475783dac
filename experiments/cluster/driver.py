"""`inferlab run CONFIG --cluster ADDRESS`: the driver's side. Every (cell, engine) pair is one Ray task
(`task.run_pair`, `max_retries=0`) asking for what the engine needs (`placement.ask`); records stream back
through the sink actor as requests finish and are written to results/<name>/... here, as a local run writes them;
each cell's report and the matrix page are built here from them.

A task lost with its node (or its worker) costs only the level it was in: the driver keeps the levels the pair
finished (their records and the manifest as it stood after the last of them), drops the interrupted level's
records and submits the pair again, which resumes past the finished levels, so the interrupted level reruns whole
on whichever node takes it: a level is never a mix of two nodes. After `[cluster] attempts` the pair is reported
failed with every attempt's reason, and the other pairs go on. Ctrl-C (or SIGTERM) cancels every task in flight
(`force=True` kills its worker; the reaper beside it kills the engine's process groups).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POLL_S = 0.3
ENV_PASSED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # and every INFERLAB_* variable: tasks run as a local run would


@dataclass
class Pair:
    cell: Any  # the cell's Config
    engine: str
    run_dir: Path
    max_model_len: int | None
    opts: dict[str, Any]  # Ray task options (placement.ask)
    attempt: int = 0
    ref: Any = None
    ed: Any = None  # its EngineDir on the driver
    finished: set = field(default_factory=set)  # (repeat, level) that ended with no failure, this pair so far
    manifest: dict[str, Any] | None = None  # as it stood after the last finished level
    written: dict = field(default_factory=dict)  # (repeat, level, request id) -> its record, as written
    history: list = field(default_factory=list)  # one entry per attempt: node, outcome
    stale: int = 0  # records of a lost attempt that arrived after it was given up
    duplicates: int = 0
    status: str | None = None
    make_model: Any = None  # commands/run.py's ensure_model, handed down (its module imports this one)
    expect: dict[str, Any] | None = None  # the driver's preflight facts

    @property
    def key(self) -> str:
        return f"{self.cell.name}/{self.engine}"


def address(given: str) -> str:
    """`auto` reads RAY_ADDRESS (else Ray's own `auto`: a cluster started on this machine)."""
    return (os.environ.get("RAY_ADDRESS") or "auto") if given == "auto" else given


def connect(given: str) -> None:
    import ray

    if not ray.is_initialized():  # a caller already connected (a test's cluster) keeps its connection
        ray.init(address=address(given), log_to_driver=False)


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in ENV_PASSED or k.startswith("INFERLAB_")}


def prepare(cfg: Any, whole: Any, toml: str, a: Any, root: Path, matrix: bool,
            files: dict[Path, dict[str, str]]) -> tuple[list[Pair], str | None]:
    """Each selected cell as the local run starts it (model made, workload built, max_model_len chosen, every
    adapter's options validated); one Pair per (cell, engine), and into `files` what each cell's folder gets
    (written once the preflight passed). Returns (pairs, a one-line error)."""
    from experiments.cluster import placement
    from experiments.running import search
    from experiments.running.runner import build_engine
    from experiments.workload import context, workloads

    cells = list(zip(cfg.cell_configs(), whole.cell_configs())) if matrix else [(cfg, whole)]
    pairs = []
    for cell, cell_whole in cells:
        if a.cell and cell.name not in a.cell:
            continue
        try:
            a.make_model(cell)
            items, warm = workloads.build(cell.model, cell.workload, cell.load.warmup)
            mml = context.choose(cell, search.sized(cell, items) + warm, workloads.context_len(cell.model))
            context.check_kv(cell, mml)
        except (ValueError, OSError) as e:
            return [], f"{a.config}: {e}"
        if cell.load.clients and cell.load.mode not in ("open", "search"):
            return [], f"{a.config}: load.clients splits an arrival schedule: it needs load.mode open or search"
        run_dir = root / cell.name
        for name in cell.all_engines():
            try:
                build_engine(cell, name, run_dir / name, mml)
            except (ValueError, TypeError) as e:
                return [], f"{a.config}: engine_options.{name}: {e}"
            pairs.append(Pair(cell, name, run_dir, mml, placement.ask(cell, name), make_model=a.make_model))
        head = (f"# cell {cell.name!r} of the matrix config {a.config} (its [[cells]] entry merged into the "
                "rest)\n") if matrix else ""
        files[run_dir] = {"config.toml": head + toml, "config.json": cell_whole.model_dump_json(indent=2),
                          "workload.json": json.dumps(workloads.describe(items, cell.workload), indent=2)}
    return pairs, None


def submit(pair: Pair, fn: Any, sink: Any, records: list[dict[str, Any]]) -> None:
    pair.attempt += 1
    keep_going = pair.manifest is not None
    payload = {"cfg": pair.cell.model_dump(mode="python"), "engine": pair.engine, "key": pair.key,
               "attempt": pair.attempt, "cwd": os.getcwd(), "max_model_len": pair.max_model_len,
               "manifest": pair.manifest if keep_going else None, "records": records if keep_going else [],
               "make_model": pair.make_model, "expect": pair.expect}
    pair.ref = fn.options(**pair.opts, max_retries=0, runtime_env={"env_vars": env()}).remote(payload, sink)


def take(sink: Any, pairs: dict[str, Pair]) -> None:
    """Write what the tasks streamed: records of a pair's current attempt, once per request id."""
    import ray

    for key, attempt, kind, data in ray.get(sink.take.remote()):
        p = pairs[key]
        if kind == "start":
            p.history.append({"attempt": attempt, **data, "outcome": "running"})
        elif attempt != p.attempt:
            p.stale += kind == "record"  # a lost attempt's message, delivered late: its level reran whole
        elif kind == "level":
            p.finished.add((data["repeat"], data["level"]))
            p.manifest = data["manifest"]
        elif kind == "record":
            rid = (int(data.get("repeat", 1)), data["level"], data["request_id"])
            if rid in p.written:
                p.duplicates += 1
                continue
            p.written[rid] = data
            p.ed.append(data)


def lost(pair: Pair, why: str) -> list[dict[str, Any]]:
    """A task that ended without returning: keep its finished levels, drop the rest; returns the records kept."""
    if pair.cell.load.mode in ("search", "sweep"):  # levels chosen as it goes: the pair reruns from its start
        pair.finished, pair.manifest = set(), None
    keep = {rid: r for rid, r in pair.written.items() if rid[:2] in pair.finished}
    dropped = sorted({f"{lvl} (repeat {rep})" for rep, lvl, _ in set(pair.written) - set(keep)})
    pair.written = keep
    pair.ed.close()
    pair.ed.requests.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in keep.values()))
    entry = pair.history[-1] if pair.history and pair.history[-1]["attempt"] == pair.attempt else \
        {"attempt": pair.attempt, "node_id": None, "hostname": None}
    if entry not in pair.history:
        pair.history.append(entry)
    entry["outcome"] = f"lost: {why}"
    entry["levels_kept"] = sorted(f"{lvl} (repeat {rep})" for rep, lvl in pair.finished)
    entry["levels_dropped"] = dropped
    return list(keep.values())


def finish(pair: Pair, result: dict[str, Any] | None, why: str | None = None) -> None:
    """Write the pair's engine folder: the task's files, or (lost on every node) the last manifest, failed."""
    pair.ed.close()
    files = dict((result or {}).get("files") or {})
    m = json.loads(files.pop("manifest.json")) if "manifest.json" in files else dict(pair.manifest or {})
    for name, data in files.items():
        (pair.ed.path / name).write_bytes(data)
    if result is None:
        m.update(status="failed", reason=why, engine=pair.engine)
    elif pair.history:
        pair.history[-1]["outcome"] = m.get("status")
    pair.status = m.get("status") or "failed"
    m["cluster"] = {"node": (result or {}).get("node"), "attempts": pair.history, "asked": pair.opts,
                    "duplicates_dropped": pair.duplicates, "late_records_dropped": pair.stale,
                    "records": len(pair.written)}
    pair.ed.write("manifest.json", m)


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


def wait_all(pairs: dict[str, Pair], fn: Any, sink: Any) -> None:
    import ray

    running = {p.ref: p for p in pairs.values()}
    while running:
        ready, _ = ray.wait(list(running), num_returns=len(running), timeout=POLL_S)
        take(sink, pairs)
        for ref in ready:
            p = running.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as e:
                take(sink, pairs)
                kept = lost(p, one_line(e))
                if p.attempt < p.cell.cluster.attempts:
                    print(f"inferlab: {p.key}: lost on attempt {p.attempt} ({one_line(e)[:120]}); "
                          f"{len(kept)} records of finished levels kept, the rest reruns", file=sys.stderr)
                    submit(p, fn, sink, kept)
                    running[p.ref] = p
                    continue
                finish(p, None, f"failed on every node tried ({p.attempt} attempts); the last: {one_line(e)}")
            else:
                take(sink, pairs)
                finish(p, result)
            where = (p.history[-1].get("hostname") if p.history else None) or "?"
            print(f"inferlab: {p.key}: {p.status} (node {where})", file=sys.stderr)


def interrupted(pairs: dict[str, Pair]) -> None:
    """Ctrl-C: cancel every task in flight (its worker killed; the reaper then kills its engine), record why."""
    import ray

    live = [p for p in pairs.values() if p.status is None and p.ref is not None]
    for p in live:
        ray.cancel(p.ref, force=True)
    for p in live:
        try:
            ray.get(p.ref, timeout=30)
        except Exception:  # cancelled, as asked
            pass
        finish(p, None, "interrupted: Ctrl-C or SIGTERM on the driver cancelled its task and stopped its engine")


def fail(msg: str) -> int:
    """One line on stderr, exit code 2 (commands/run.py's convention)."""
    print(f"inferlab: {msg}", file=sys.stderr)
    return 2


def run(cfg: Any, whole: Any, toml: str, a: Any, given: str) -> int:
    """The whole run on the cluster at `given`; exit codes as a local run's. `a`: the command's arguments, with
    `make_model` (commands/run.py's ensure_model) added."""
    import ray

    from experiments.cluster import placement, preflight, sink as sinks
    from experiments.cluster.task import run_pair
    from experiments.running.results import EngineDir

    if a.resume:
        return fail("--resume with --cluster: not supported; a node lost mid-run already reruns only its level")
    matrix = bool(cfg.cells)
    root = Path(a.out) / cfg.name if matrix else Path(a.out)
    files: dict[Path, dict[str, str]] = {}
    pairs, err = prepare(cfg, whole, toml, a, root, matrix, files)
    if err:
        return fail(err)
    connect(given)
    facts, err = preflight.check(sorted({id(p.cell): p.cell for p in pairs}.values(), key=lambda c: c.name),
                                 os.getcwd())
    if err:
        return fail(err)
    print(f"inferlab: preflight passed on {len(facts) - 1} node(s)", file=sys.stderr)
    for p in pairs:
        p.expect = facts[0]  # the driver's: a node that joins later is checked by the task itself
    if a.dry_run:
        lines, err = placement.plan([(p.cell.name, p.engine, p.opts) for p in pairs], ray.nodes())
        print("\n".join(lines))
        return fail(f"{a.config}: {err}") if err else 0
    for run_dir, texts in files.items():
        run_dir.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (run_dir / name).write_text(text)
    by_key = {p.key: p for p in pairs}
    for p in pairs:
        p.ed = EngineDir(p.run_dir, p.engine)
        p.ed.requests.unlink(missing_ok=True)  # a fresh run: this engine's records start empty
    sink = sinks.start()
    fn = ray.remote(run_pair)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main else None
    t0 = time.monotonic()
    try:
        for p in pairs:
            submit(p, fn, sink, [])
        wait_all(by_key, fn, sink)
    except KeyboardInterrupt:
        interrupted(by_key)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    print(f"inferlab: every pair done in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return report(cfg, whole, a, root, pairs, matrix)


def report(cfg: Any, whole: Any, a: Any, root: Path, pairs: list[Pair], matrix: bool) -> int:
    from experiments.report import build, matrix as matrix_page

    for run_dir in dict.fromkeys(p.run_dir for p in pairs):
        print(f"inferlab: report written to {build([run_dir], run_dir)}", file=sys.stderr)
    if matrix:
        (root / "matrix.json").write_text(json.dumps(whole.model_dump(mode="python"), indent=2, default=str))
        page = matrix_page.build(root, whole, command=f"inferlab run {a.config} --cluster ...")
        print(f"inferlab: matrix report written to {page}", file=sys.stderr)
    required = {(p.cell.name, p.engine) for p in pairs if p.engine in p.cell.engine_list()}
    if any(p.status == "unavailable" and (p.cell.name, p.engine) in required for p in pairs):
        return 2
    return 1 if any(p.status == "failed" for p in pairs) else 0


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
