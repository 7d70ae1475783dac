"""`make simulate-bench`: the simulator's validation (issue 40), predict first, measure second, in
phases, each short enough (under ~10 min) to hold the shared bench lock (`flock /tmp/inferlab-bench.lock`)
on its own; the Makefile runs the timed ones under it.

    python -m experiments.simulate.bench PHASE [--out DIR]

    calibrate   (timed) the step-time model on this CPU: DIR/profile-reference.json (+ .steps.json)
    trace       (timed) step level, teacher-forced: the served config's prompts in-process at 1/4/8
                streams, each step's wall time against its prediction: DIR/teacher_forced.json
    served-cal  (timed) a served calibration run (bench/served_cal.toml: other questions, 1/3/6 streams),
                with its step log, then the served overhead fitted from both into the profile (served_overhead.py)
    predict     the predictions, before any validation run: closed loop (bench/served.toml) and the SLO
                search (bench/search.toml), each answer given its offline greedy EOS length
    served      (timed) `inferlab run` of bench/served.toml
    search      (timed) `inferlab run` of bench/search.toml
    poisson     predict, then (timed) run Poisson at 50/85/95 % of the measured search capacity
    peer-sweep  (timed) the peer's step times, from the step timer its spec names (vLLM-CPU's: offline
                generate on controlled batches, adapters/engines/vllm/step_sweep.py, in .venv-vllm), its
                settings read back: DIR/peer-sweep.json
    peer-predict  the peer's profile fitted on them (DIR/profile-peer.json), then bench/peer.toml predicted
                with the peer's settings as read back
    peer        (timed) `inferlab run` of bench/peer.toml (vLLM-CPU served)
    published   the H200 spec profile against TensorRT-LLM's table, 10^5 requests over 8 replicas
    report      DIR/bench.json (the tables `python -m experiments.simulate.bench_md` prints) and merged
                reports with "predicted vs measured": DIR/merged-<name>/report.md

The engines come from the configs: the simulated one is bench/served.toml's, the peer bench/peer.toml's.
Every phase records the load average as it begins and ends (DIR/load.json). Timing bars are not
asserted here: the page reads them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent / "bench"
PY = [sys.executable, "-m", "experiments.cli"]
LOADS = (0.5, 0.85, 0.95)
LENGTHS_CAP = 960  # requests with a known EOS length: a level of 32 req/s for 30 s
REPEATS = 3  # served.toml and served_cal.toml say the same: each level in 3 fresh server processes


def logged(config: Path, out: Path) -> Path:
    """The config as measured: the same file with its reference server logging each step it runs
    (`step_log`, reference_engine/engine/step_log.py) to OUT/steps/<name>.jsonl, one pid per server
    process. The prediction reads the file as it is: the log is an observation, not a setting."""
    from experiments.workload.config import load

    steps = out.absolute() / "steps"
    steps.mkdir(exist_ok=True)
    head = f"[engine_options.{subject()}]\n"
    text = config.read_text()
    if head not in text:
        raise SystemExit(f"{config}: no {head.strip()} table to add the step log to")
    path = out / f"{config.stem}-logged.toml"
    path.write_text(text.replace(head, f'{head}step_log = "{steps / (load(config).name + ".jsonl")}"\n', 1))
    return path


def subject() -> str:
    """The simulated engine: bench/served.toml's (every bench config but peer.toml runs it)."""
    from experiments.workload.config import load

    return load(HERE / "served.toml").engine_list()[0]


def sweep_peer(cfg, model: str, out: Path) -> None:
    """Time the peer's steps with the step timer its spec names, in the interpreter of its launcher (a venv
    folder), with the environment its config gives its server, eager if the config runs it eager."""
    from adapters import registry

    name = cfg.engine_list()[0]
    spec, opts = registry.spec(cfg.adapter(name)), cfg.engine_options.get(name, {})
    if spec is None or spec.step_timer is None:
        raise SystemExit(f"engine {name!r} has no step timer (EngineSpec.step_timer)")
    python = Path(opts.get("launcher") or spec.venv or "") / "bin" / "python"  # the snapshot links the checkout's venvs
    env = {**os.environ, **{k: str(v) for k, v in (opts.get("env") or {}).items()}}
    subprocess.run([str(python.absolute()), spec.step_timer, model, str(out)]
                   + (["--enforce-eager"] if opts.get("enforce_eager") else []), check=True, env=env)


def sh(*args: str) -> None:
    print("+ inferlab " + " ".join(args), file=sys.stderr, flush=True)
    subprocess.run(PY + list(args), check=True)


def lengths_for(config: Path, out: Path) -> Path:
    """The config's workload's greedy EOS lengths (the engine, offline): what the simulator may know."""
    from experiments.running import search
    from experiments.simulate import sweep
    from experiments.workload import workloads
    from experiments.workload.config import load

    cfg = load(config)
    # every request a search level may send (experiments/running/search.py: levels last load.search.level_s), up to
    # LENGTHS_CAP: the bound assumes every doubling passes; a level past the cap runs its extra requests to
    # max_tokens and the simulated manifest counts them
    w = search.every_request(cfg)
    w = w.model_copy(update={"num_requests": min(w.num_requests, max(cfg.workload.num_requests, LENGTHS_CAP))})
    items, warm = workloads.build(cfg.model, w, cfg.load.warmup)
    ecfg = sweep.engine_config(cfg.model, cfg.dtype, {}, kv_cache_tokens=65536, max_model_len=4096)
    path = out / f"{cfg.name}-lengths.json"
    path.write_text(json.dumps(sweep.eos_lengths(ecfg, items + warm, cfg.sampling.ignore_eos, cfg.sampling.temperature),
                                indent=1))
    return path


def calibration_threads(prof) -> int | None:
    """The threads the profile's sweep ran with (its notes say `num_threads=N`), or None."""
    return int(prof.notes.split("num_threads=")[1].split(";")[0]) if "num_threads=" in prof.notes else None


def teacher_forced(config: Path, profile_path: Path, out: Path | None = None, requests: int | None = None,
                   options: bool = False, streams: tuple[int, ...] = (1, 4, 8)) -> dict:
    """The engine serves the config's prompts (the first `requests` of them, at least twice the streams) in-process
    at each of `streams`, with the calibration's threads, prefix caching on (and with `options`, the config's
    engine options: its step budget); each step's wall time against the profile's prediction for its batch.
    The timed steps go to OUT/trace-c{N}.steps.json."""
    from experiments.simulate import calibrate, sweep
    from experiments.simulate.step_model import ModelShape, Profile, regime
    from experiments.workload import workloads
    from experiments.workload.config import load

    cfg, prof = load(config), Profile.load(profile_path)
    every, _ = workloads.build(cfg.model, cfg.workload, 0)
    threads = calibration_threads(prof)
    opts = cfg.engine_options.get(cfg.engine_list()[0], {}) if options else {}
    ecfg = sweep.engine_config(cfg.model, cfg.dtype, opts, kv_cache_tokens=cfg.kv.tokens, num_threads=threads)
    shape, res = ModelShape.from_dir(cfg.model, cfg.dtype), {}
    for c in streams:
        items = every[:max(requests, 2 * c)] if requests else every
        rows = sweep.trace(ecfg, [it.prompt_token_ids for it in items], [it.output_len for it in items], c,
                           cfg.sampling.ignore_eos, temperature=cfg.sampling.temperature)
        if out is not None:
            sweep.dump(rows, out / f"trace-c{c}.steps.json")
        res[f"{c} streams: all"] = calibrate.errors(rows, shape, prof)
        for g in ("decode", "mixed"):
            res[f"{c} streams: {g}"] = calibrate.errors(
                [(s, d) for s, d in rows if regime(s, prof.fused_max_rows) == g], shape, prof)
    return res


def poisson_config(search_cfg: Path, rates: list[float], out: Path, name: str = "sim_poisson",
                   min_requests: int = 0) -> Path:
    """The search config at fixed rates, measured in REPEATS fresh server processes like served.toml.
    Each level lasts as a search level does: its requests are the highest rate's level_s seconds of
    arrivals (experiments/running/search.py), so the lower rates run longer; `min_requests` at least."""
    from experiments.running import search
    from experiments.workload.config import load

    cfg = load(search_cfg)
    n = max(min_requests, search.level_size(max(rates), cfg.workload.num_requests, cfg.load.search.level_s))
    text = re.sub(r'(?m)^name = ".*"$', f'name = "{name}"\nrepeats = {REPEATS}', search_cfg.read_text(), count=1)
    text = re.sub(r"(?m)^num_requests = \d+", f"num_requests = {n}", text)
    text = text.replace('mode = "search"', f'mode = "open"\nrate = [{", ".join(f"{r:.3f}" for r in rates)}]')
    path = out / f"{name}.toml"
    path.write_text(text)
    return path


def summary(run: Path, engine: str) -> dict:
    return json.loads((run / engine / "summary.json").read_text())["levels"]


def search_of(run: Path, engine: str) -> dict:
    """The run's SLO search (its manifest's first repeat): points, target, best_rate, failing_rate."""
    m = json.loads((run / engine / "manifest.json").read_text())
    return ((m.get("repeats") or {}).get("1") or {}).get("search") or {}


def search_rate(run: Path, engine: str) -> float | None:
    return search_of(run, engine).get("best_rate")


def compare(measured: Path, predicted: Path, name: str, out: Path, engine: str) -> dict:
    from experiments.report.predicted import errors

    m, p = summary(measured / name, engine), summary(predicted / f"{name}-simulated", f"{engine}-simulated")
    sh("report", str(measured / name), str(predicted / f"{name}-simulated"), "--out", str(out / f"merged-{name}"))
    return {lv: {"errors": errors(m[lv], p[lv]),
                 "measured": {k: m[lv][k] for k in ("ttft_ms", "tpot_ms", "e2el_ms", "output_throughput")},
                 "predicted": {k: p[lv][k] for k in ("ttft_ms", "tpot_ms", "e2el_ms", "output_throughput")}}
            for lv in m if lv in p}


def record_load(out: Path, phase: str, when: str) -> None:
    path = out / "load.json"
    d = json.loads(path.read_text()) if path.is_file() else {}
    d.setdefault(phase, {})[when] = {"utc": time.strftime("%H:%M:%S", time.gmtime()), "loadavg": os.getloadavg()}
    path.write_text(json.dumps(d, indent=1))


def phase(name: str, out: Path) -> None:
    from experiments.workload.config import load

    meas, pred, prof = out / "measured", out / "predicted", out / f"profile-{subject()}.json"
    served, search, cal, peer = HERE / "served.toml", HERE / "search.toml", HERE / "served_cal.toml", HERE / "peer.toml"
    if name == "calibrate":
        sh("simulate", str(served), "--calibrate", "--profile", str(prof))
    elif name == "trace":
        (out / "teacher_forced.json").write_text(json.dumps(teacher_forced(served, prof, out), indent=1))
    elif name == "served-cal":
        if not (meas / "sim_served_cal").is_dir():
            sh("run", str(logged(cal, out)), "--out", str(meas), "--no-progress")
        sh("simulate", str(cal), "--profile", str(prof), "--fit-served", str(meas / "sim_served_cal"),
           "--steps-log", str(out / "steps" / "sim_served_cal.jsonl"),
           "--out", str(out / "fit"))
    elif name == "predict":
        for cfg in (served, search):
            sh("simulate", str(cfg), "--profile", str(prof), "--lengths", str(lengths_for(cfg, out)), "--out", str(pred))
    elif name in ("served", "search"):
        cfg = served if name == "served" else search
        if not (meas / load(cfg).name).is_dir():
            sh("run", str(logged(cfg, out) if name == "served" else cfg), "--out", str(meas), "--no-progress")
    elif name == "poisson":
        cap = search_rate(meas / "sim_search", subject())
        pcfg = poisson_config(search, [f * cap for f in LOADS], out)
        sh("simulate", str(pcfg), "--profile", str(prof), "--lengths", str(lengths_for(pcfg, out)), "--out", str(pred))
        if not (meas / "sim_poisson").is_dir():
            sh("run", str(logged(pcfg, out)), "--out", str(meas), "--no-progress")
    elif name == "peer-sweep":
        sweep_peer(load(peer), load(served).model, out / "peer-sweep.json")
    elif name == "peer-predict":
        vprof = out / "profile-peer.json"
        sh("simulate", str(peer), "--calibrate-from", str(out / "peer-sweep.json"), "--peaks-from",
           str(prof), "--profile", str(vprof), "--out", str(out / "fit"))
        sh("simulate", str(peer), "--engine", load(peer).engine_list()[0], "--profile", str(vprof), "--settings-from",
           str(out / "peer-sweep.json"), "--lengths", str(lengths_for(served, out)), "--out", str(pred))
    elif name == "peer":
        if not (meas / load(peer).name).is_dir():
            sh("run", str(peer), "--out", str(meas), "--no-progress")
    elif name == "published":
        from experiments.simulate import published
        from experiments.simulate.step_model import load_profile

        h200 = load_profile("h200")
        res = {"source": published.SOURCE, "source_v0_17": published.SOURCE_V017, "rows": published.table(h200),
               "at_scale": published.at_scale(h200, osl=64, names=("least_loaded",))
               + published.at_scale(h200, n=20_000, rate=100.0, replicas=2, osl=64)}
        (out / "published.json").write_text(json.dumps(res, indent=1, default=str))
    elif name == "report":
        report(out, meas, pred, prof)
    else:
        raise SystemExit(f"unknown phase {name!r}")


def report(out: Path, meas: Path, pred: Path, prof: Path) -> None:
    res: dict = {"profile": json.loads(prof.read_text())}
    for key, f in (("teacher_forced", "teacher_forced.json"), ("load", "load.json"), ("published", "published.json")):
        if (out / f).is_file():
            res[key] = json.loads((out / f).read_text())
    from experiments.workload.config import load

    for key, name in (("served", "sim_served"), ("poisson", "sim_poisson")):
        if (meas / name).is_dir() and (pred / f"{name}-simulated").is_dir():
            res[key] = compare(meas, pred, name, out, subject())
            res[key + "_measured_lengths"] = remeasured(meas, name, prof, out)
    peer = load(HERE / "peer.toml")
    if (meas / peer.name).is_dir() and (pred / f"{peer.name}-simulated").is_dir():
        res["peer"] = compare(meas, pred, peer.name, out, peer.engine_list()[0])
        res["peer_profile"] = json.loads((out / "profile-peer.json").read_text())
    from experiments.simulate.step_model import ModelShape, Profile

    cfg = load(HERE / "served.toml")  # every bench config serves this model
    shape, p = ModelShape.from_dir(cfg.model, cfg.dtype), Profile.load(prof)
    res["served_steps"] = {n: served_steps(out / "steps" / f"{n}.jsonl", p, shape)
                           for n in ("sim_served_cal", "sim_served", "sim_poisson") if (out / "steps" / f"{n}.jsonl").is_file()}
    if (meas / "sim_search").is_dir():
        res["capacity"] = {"measured": search_rate(meas / "sim_search", subject()),
                           "predicted": search_rate(pred / "sim_search-simulated", f"{subject()}-simulated")}
    (out / "bench.json").write_text(json.dumps(res, indent=2, default=str))
    print(f"bench written to {out / 'bench.json'}", file=sys.stderr)


def read_log(log: Path) -> dict:
    from reference_engine.engine.step_log import read

    return read(str(log))


def served_steps(log: Path, p, m) -> dict:
    """Step level, teacher-forced on the served runs themselves: every step each server process ran (its
    step log; a process per repeat, in the order they ran) against the profile's prediction for its batch
    as served (the in-process prediction plus the profile's served step terms; profile P, model shape M).
    `speed`: each process's errors against the in-process prediction alone, whose signed median is the
    process's speed against the calibration's machine (the drift between processes)."""
    from experiments.simulate import calibrate, sweep
    from experiments.simulate.step_model import regime

    per = {str(pid): sweep.shapes(steps) for pid, steps in read_log(log).items()}
    res = {"processes": {k: calibrate.errors(rows, m, p, served=True) for k, rows in per.items()},
           "speed": {k: calibrate.errors(rows, m, p) for k, rows in per.items()}}
    rows = [r for v in per.values() for r in v]
    res["all"] = calibrate.errors(rows, m, p, served=True)
    for g in ("decode", "mixed"):
        res[g] = calibrate.errors([(s, d) for s, d in rows if regime(s, p.fused_max_rows) == g], m, p, served=True)
    return res


def remeasured(meas: Path, name: str, prof: Path, out: Path) -> dict:
    """The same prediction with each answer given the length the served engine produced (isolates the
    timing model from greedy answers that differ between the offline and the served engine)."""
    from experiments.report.predicted import errors

    cfg = {"sim_served": HERE / "served.toml", "sim_poisson": out / "sim_poisson.toml"}[name]
    alt = out / "predicted-measured-lengths"
    sh("simulate", str(cfg), "--profile", str(prof), "--lengths", str(meas / name / subject()), "--out", str(alt))
    m, p = summary(meas / name, subject()), summary(alt / f"{name}-simulated", f"{subject()}-simulated")
    return {lv: {"errors": errors(m[lv], p[lv])} for lv in m if lv in p}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.simulate.bench")
    ap.add_argument("phase", choices=["calibrate", "trace", "served-cal", "predict", "served", "search", "poisson",
                                      "peer-sweep", "peer-predict", "peer", "published", "report"])
    ap.add_argument("--out", default="results/simulate-bench")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record_load(out, a.phase, "start")
    phase(a.phase, out)
    record_load(out, a.phase, "end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
