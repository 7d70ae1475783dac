"""`inferlab simulate CONFIG [--calibrate | --capacity]` (routed here by experiments/cli.py).

    inferlab simulate CONFIG --calibrate           time a sweep of step shapes on the config's engine, fit
                                                   the step-time model, write the device profile JSON
    inferlab simulate CONFIG [--profile P]         replay the config's workload and load in simulated time:
                                                   a run folder <out>/<name>-simulated, report included
    inferlab simulate CONFIG --capacity --slo ttft_p99_ms=1000,tpot_p99_ms=100 [--replicas N --router R]
                                                   the highest Poisson rate per replica meeting the SLO; with
                                                   --target-rate, the replicas needed for it

Exit codes: 0 done; 2 a config or usage problem (one line on stderr).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from adapters import registry
from experiments.commands.run import Parser, ensure_model, fail
from experiments.workload.config import ConfigError, load

DEFAULT_DIR = Path("results/simulate/profiles")


def simulated(adapter: str) -> bool:
    """Whether the simulator steps this engine's own scheduler (its spec says so: the reference engine's)."""
    spec = registry.spec(adapter)
    return spec is not None and spec.simulated


def default_profile(engine: str) -> Path:
    return DEFAULT_DIR / f"{engine}-{os.uname().nodename}.json"


def parser() -> Parser:
    p = Parser(prog="inferlab simulate", description="predict a run in simulated time; calibrate; plan capacity")
    p.add_argument("config")
    p.add_argument("--calibrate", action="store_true", help="time a sweep of step shapes and write the profile")
    p.add_argument("--also-model", action="append", default=[], metavar="DIR",
                   help="with --calibrate: sweep this model too and fit both at once (sizes 10x apart in weight bytes "
                        "keep the weight read out of the per-step constant); repeatable")
    p.add_argument("--profile", help="profile JSON or a shipped spec sheet (h100, h200, a100, l40s); default: "
                                     "this machine's calibrated one, results/simulate/profiles/ENGINE-HOST.json")
    p.add_argument("--anchor", metavar="MODEL_DIR", action="append",
                   help="first re-time the profile's memory-bound terms on a model it was fitted on, timed now (~15 s "
                        "a model): a shared VM's speed drifts (anchor.py); repeatable: the geometric mean over them")
    p.add_argument("--anchor-log", metavar="STEP_LOG", action="append",
                   help="with --anchor: read that model's speed from a served run's step log (`inferlab serve "
                        "--step-log`) instead of timing it in-process; one per --anchor, in order")
    p.add_argument("--engine", help="simulate only this engine of the config")
    p.add_argument("--cell", help="a matrix config ([[cells]]): simulate this cell (its settings merged in)")
    p.add_argument("--lengths", help="JSON {request_id: output tokens} (each answer's EOS length) or a measured "
                                     "run's engine folder; without it answers that may stop at EOS run to max_tokens")
    p.add_argument("--settings-from", metavar="RUN_DIR", help="take the engine's scheduler settings as read back "
                                                              "in this measured run (e.g. vLLM's)")
    p.add_argument("--accept", type=float, default=0.7, help="speculative decoding: the acceptance rate, accepted "
                                                             "draft tokens / draft tokens, as the engine's counters report it "
                                                             "(default 0.7)")
    p.add_argument("--calibrate-from", metavar="SWEEP_JSON", help="fit --profile from step times measured elsewhere "
                                                                  "(a step timer's output, e.g. adapters/engines/vllm/step_sweep.py), at the peaks of --peaks-from")
    p.add_argument("--peaks-from", metavar="PROFILE", help="with --calibrate-from: a calibrated profile of this "
                                                          "machine whose measured peaks to reuse")
    p.add_argument("--fit-served", metavar="RUN_DIR", help="fit the served overhead (HTTP, SSE, the engine-core "
                                                           "pipe) into --profile from a measured closed-loop run of "
                                                           "this config (a calibration run, not the one validated)")
    p.add_argument("--steps-log", metavar="JSONL", help="with --fit-served: that run's step log (`inferlab serve "
                                                        "--step-log`): the per-step and per-sequence terms are fitted "
                                                        "on its steps against their in-process prediction")
    p.add_argument("--step-spread", action="store_true", help="with --fit-served and --steps-log: also fit how far "
                   "each served step strays from its prediction, and draw simulated served steps with it (a closed "
                   "loop's streams then drift apart as real ones do; off by default: docs/perf/2026-12-07-heldout-round9.md)")
    p.add_argument("--capacity", action="store_true", help="search the highest rate per replica meeting --slo")
    p.add_argument("--slo", default="", help="e.g. ttft_p99_ms=1000,tpot_p99_ms=100 (metric_stat_ms=limit)")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--router", default="round_robin", choices=["round_robin", "least_loaded", "prefix_aware"])
    p.add_argument("--requests", type=int, default=None, help="capacity: requests per level (default: "
                                                              "the workload's, cycled to at least 2000)")
    p.add_argument("--target-rate", type=float, help="capacity: replicas needed for this many requests/s")
    p.add_argument("--explain-profile", action="store_true", help="print what --profile (a GPU spec sheet) sizes for "
                                                                  "this config's model and [parallel]: the KV tokens "
                                                                  "and each term of a step, with their sources")
    p.add_argument("--out", default="results", help="results root (default: results)")
    return p


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    try:
        cfg = load(a.config, engine=a.engine)
    except ConfigError as e:
        return fail(str(e))
    if a.calibrate and a.capacity:
        return fail("--calibrate and --capacity are separate steps: calibrate first, then plan")
    if a.replicas < 1:
        return fail(f"--replicas must be >= 1, got {a.replicas}")
    if not 0 <= a.accept <= 1:
        return fail(f"--accept must be in [0, 1], got {a.accept}")
    from experiments.simulate import capacity

    try:
        slo = (capacity.parse_slo(a.slo) if a.slo else capacity.config_rule(cfg)) if a.capacity else None
    except ValueError as e:
        return fail(str(e))
    toml = Path(a.config).read_text()
    if cfg.cells:
        cells = {c.name: c for c in cfg.cell_configs()}
        if a.cell not in cells:
            return fail(f"{a.config}: a matrix config: give --cell NAME to simulate one cell ({', '.join(cells)})")
        cfg, toml = cells[a.cell], f"# cell {a.cell!r} of the matrix config {a.config}\n" + toml
    elif a.cell:
        return fail(f"{a.config}: --cell is for a matrix config ([[cells]]); this one has none")
    engines = [e for e in cfg.engine_list() if a.settings_from or a.calibrate_from or simulated(cfg.adapter(e))]
    if not engines:
        return fail(f"{a.config}: no reference engine to simulate (the simulator runs the reference engine's "
                    f"scheduler); give --engine NAME --settings-from RUN_DIR (a measured run of it) for another")
    engine = engines[0]
    try:
        ensure_model(cfg)
        if a.calibrate:
            return _calibrate(cfg, engine, a)
        if a.calibrate_from:
            return _calibrate_from(cfg, engine, a)
        profile = _profile(a.profile, engine)
        if a.anchor_log and len(a.anchor_log) != len(a.anchor or []):
            raise ValueError(f"--anchor-log: {len(a.anchor_log)} step log(s) for {len(a.anchor or [])} --anchor model(s): "
                             "give one log per model, in order")
        if a.anchor:
            profile = _anchor(profile, a.anchor, a.anchor_log)
        lengths = _lengths(a.lengths)
        settings = None
        if a.settings_from:
            from experiments.simulate.replay import read_settings

            settings = read_settings(a.settings_from, engine)
    except (ValueError, OSError) as e:
        return fail(f"{a.config}: {e}")
    if a.explain_profile:
        from experiments.simulate import gpu
        from experiments.simulate.step_model import ModelShape

        opts = cfg.engine_options.get(engine, {})
        try:
            print(gpu.explain(profile, ModelShape.from_dir(cfg.model, cfg.dtype), cfg.parallel.tensor if cfg.parallel else 1,
                              utilization=opts.get("gpu_memory_utilization"),
                              max_num_batched_tokens=opts.get("max_num_batched_tokens", 8192),
                              max_num_seqs=opts.get("max_num_seqs", 256)))
        except ValueError as e:
            return fail(f"{a.config}: {e}")
        return 0
    if a.fit_served:
        return _fit_served(cfg, engine, a, profile)
    if a.capacity:
        print(capacity.run(cfg, engine, profile, slo, a.replicas, a.router, lengths, a.requests,
                           a.target_rate, Path(a.out), a.accept, settings))
        return 0
    from experiments.simulate.replay import replay

    skipped = sorted(set(cfg.engine_list()) - set(engines))
    if skipped:
        print(f"inferlab: not simulated (not the reference engine; --settings-from a run of one to replay it with "
              f"its settings): {', '.join(skipped)}", file=sys.stderr)
    run_dir = replay(cfg, toml, profile, Path(a.out), lengths, a.accept, settings, engines)
    print(f"inferlab: simulated run ({profile.label}) written to {run_dir}/report.md", file=sys.stderr)
    return 0


def _anchor(profile, model_dirs: list[str], logs: list[str] | None = None):
    from experiments.simulate import anchor, bench

    for d in model_dirs:
        if not (Path(d) / "config.json").is_file():
            raise ValueError(f"--anchor {d}: no config.json there")
    for log in logs or []:
        if not Path(log).is_file():
            raise ValueError(f"--anchor-log {log}: no such file")
    if logs:
        got = anchor.served(profile, list(zip(model_dirs, logs)))
    else:
        threads = bench.calibration_threads(profile) or os.cpu_count() or 1  # as the profile's sweep ran
        got = anchor.anchor(profile, model_dirs, threads)
    x = got.anchored
    what = "served decode step" if logs else "one-row decode"
    for p in x.get("per_model") or [x]:
        print(f"inferlab: anchored on {p['model']}: {what} {p['measured_ms']:.1f} ms measured, "
              f"{p['predicted_ms']:.1f} ms predicted", file=sys.stderr)
    print(f"inferlab: memory terms x{x['factor']:.3f}", file=sys.stderr)
    if x.get("spread", 0.0) > anchor.SPREAD:
        print(f"inferlab: warning: the anchor's server processes ran {x['spread']:.0%} apart in speed (more than "
              f"{anchor.SPREAD:.0%}): a sample of processes, not the machine's speed; pool more (repeats) or predict "
              "without --anchor (docs/perf/2026-12-07-heldout-round8.md)", file=sys.stderr)
    return got


def _profile(given: str | None, engine: str):
    from experiments.simulate.step_model import load_profile

    if given:
        return load_profile(given)
    path = default_profile(engine)
    if not path.is_file():
        raise ValueError(f"no profile for {engine} on this machine ({path}): run `inferlab simulate CONFIG "
                         f"--calibrate` first, or give --profile h200 (uncalibrated spec sheet)")
    return load_profile(str(path))


def _lengths(given: str | None) -> dict[str, int] | None:
    if not given:
        return None
    p = Path(given)
    if p.is_dir():
        recs = [json.loads(ln) for ln in (p / "requests.jsonl").read_text().splitlines() if ln.strip()]
        return {r["request_id"]: len(r["output_token_ids"]) for r in recs}
    raw = json.loads(p.read_text())
    if not isinstance(raw, dict) or not all(isinstance(v, int) for v in raw.values()):
        raise ValueError(f"--lengths {given}: expected a JSON object of request id -> output tokens")
    return raw


def _calibrate(cfg, engine: str, a) -> int:
    from experiments.measuring import bandwidth, ceilings
    from experiments.running import search
    from experiments.simulate import calibrate, sweep
    from experiments.simulate.step_model import ModelShape
    from experiments.workload import workloads

    if not simulated(cfg.adapter(engine)):
        return fail(f"--calibrate runs the reference engine here; engine {engine!r} is calibrated from a measured "
                    f"run (docs/perf/2026-12-04-simulate.md says how far vLLM-CPU got)")
    opts = dict(cfg.engine_options.get(engine, {}))
    if "num_threads" not in opts:
        from reference_engine.server.cli import serving_threads

        opts["num_threads"] = serving_threads(opts.get("engine_process", True)) if opts.get("mode") == "server" \
            else (os.cpu_count() or 1)  # what `inferlab serve` (or torch in-process) runs with
    for model in a.also_model:
        if not (Path(model) / "config.json").is_file():
            return fail(f"--also-model {model}: no config.json there")
    ecfg = sweep.engine_config(cfg.model, cfg.dtype, opts, kv_cache_tokens=65536, max_model_len=4096)
    print(f"inferlab: calibrating {engine} ({ecfg.num_threads} threads): peaks, then the sweep", file=sys.stderr)
    bw = bandwidth.peak_copy_gbps()["cpu_gbps"]
    peak = ceilings.compute_peak(cfg.model, cfg.dtype)
    if not peak.get("gflops"):
        return fail(f"compute ceiling not measured: {peak.get('error')}")
    rows, shapes = [], []
    dirs = [cfg.model, *a.also_model]  # swept interleaved, level by level (sweep.sweep_many: the machine's drift)
    for model, (got, paths) in zip(dirs, sweep.sweep_many(
            [sweep.engine_config(m, cfg.dtype, opts, kv_cache_tokens=65536, max_model_len=4096) for m in dirs])):
        rows += got
        shapes += [ModelShape.from_dir(model, cfg.dtype)] * len(got)
    models = ", ".join(f"{Path(m).name} ({ModelShape.from_dir(m, cfg.dtype).weight_bytes / 1e6:.0f} MB)"
                       for m in [cfg.model, *a.also_model])
    from experiments.simulate import kernels
    from experiments.simulate.step_model import Profile, TERMS

    at_peak = Profile("peaks", bw, {cfg.dtype: peak["gflops"] / 1e3}, dict.fromkeys(TERMS, 0.0))
    att = kernels.prefill_attention([ModelShape.from_dir(m, cfg.dtype) for m in dirs], at_peak, ecfg.num_threads)
    print(f"inferlab: the prefill attention kernel runs at {att['ratio']:.2f}x its FLOP roofline (median over "
          f"{len(att['per_model'])} geometries): held in the fit", file=sys.stderr)
    prof = calibrate.calibrate(rows, shapes, bw, peak["gflops"] / 1e3, engine,
                               notes=f"num_threads={ecfg.num_threads}; step wall times of a ragged closed-loop sweep and its shared-prefix levels "
                                     f"(each step the median of 3 repeats) on {models}; measure it quiet (under the "
                                     f"bench lock); paths {paths.get('linear')}, one-call decode layer up to "
                                     f"{paths.get('fused_decode_max_rows')} rows; peaks measured at calibration",
                               fused_max_rows=int(paths.get("fused_decode_max_rows") or 0),
                               cache_bytes=calibrate.resident_bytes(), fixed={"mixed": {"attention": att["ratio"]}})
    prof.fit["attention_kernel"] = att
    for size, parts in prof.fit["models"].items():
        for rows_, p in parts.items():
            print(f"inferlab: {size} model, {rows_} at context 1024: {p['seconds'] * 1e3:.2f} ms = " + ", ".join(
                f"{k} {v:.0%}" for k, v in p.items() if k != "seconds" and v >= 0.005), file=sys.stderr)
    out = default_profile(engine) if not a.profile else Path(a.profile)
    prof.save(out)
    sweep.dump(rows, out.with_suffix(".steps.json"))
    items, warm = workloads.build(cfg.model, search.every_request(cfg), cfg.load.warmup)
    lengths = {it.request_id: it.output_len for it in items + warm} if cfg.sampling.ignore_eos else \
        sweep.eos_lengths(ecfg, items + warm, False, cfg.sampling.temperature)  # an answer ignoring EOS is max_tokens
    lpath = out.with_name(f"{cfg.name}-lengths.json")
    lpath.write_text(json.dumps(lengths, indent=1))
    f = prof.fit["sweep"]
    print(f"inferlab: profile written to {out} ({f['steps']} steps, |error| median {f['median_abs']:.1%}, "
          f"p90 {f['p90_abs']:.1%}); answer lengths of the workload in {lpath}", file=sys.stderr)
    return 0


def _fit_served(cfg, engine: str, a, profile) -> int:
    """Simulate the measured calibration run without a served overhead, fit it, save it into --profile."""
    from experiments.simulate import served_overhead
    from experiments.simulate.replay import replay
    from experiments.simulate.step_model import ModelShape

    if not a.profile or not Path(a.profile).is_file():
        return fail("--fit-served writes into the profile it reads: give --profile PATH (a calibrated profile JSON)")
    if a.step_spread and not a.steps_log:
        return fail("--step-spread is fitted on the served run's step log: give --steps-log JSONL")
    run = Path(a.fit_served)
    try:
        lengths = _lengths(str(run / engine))
        steps = served_overhead.fit_steps(served_overhead.logged_rows(a.steps_log),
                                          ModelShape.from_dir(cfg.model, cfg.dtype), profile) if a.steps_log else {}
        served_overhead.apply(profile, steps, "")  # the simulation the request terms are fitted against has them
        sim = replay(cfg, Path(a.config).read_text(), profile, Path(a.out) / "served-fit", lengths, a.accept,
                     None, [engine])
        terms = {**served_overhead.fit(served_overhead.levels(run, engine),
                                       served_overhead.levels(sim, f"{engine}-simulated")), **steps}
        spread = served_overhead.fit_spread(a.steps_log, ModelShape.from_dir(cfg.model, cfg.dtype),
                                            served_overhead.apply(profile, terms, "")) if a.step_spread else 0.0
    except (ValueError, OSError, KeyError) as e:
        return fail(f"--fit-served {run}: {e}")
    served_overhead.apply(profile, {**terms, "step_spread": spread}, f"{run} ({cfg.name}): requests fitted against "
                          f"its simulation" + (f", steps on its step log {a.steps_log}" if a.steps_log else " without overhead"))
    profile.save(a.profile)
    print(f"inferlab: served overhead {', '.join(f'{k} {v * 1e3:.2f} ms' for k, v in terms.items())}"
          + (f", step spread {spread:.1%}" if a.step_spread else "") + f" written to {a.profile}", file=sys.stderr)
    return 0


def _calibrate_from(cfg, engine: str, a) -> int:
    """A profile fitted on another tool's timed steps (vLLM's: adapters/engines/vllm/step_sweep.py), at this machine's peaks."""
    from experiments.simulate import calibrate, sweep
    from experiments.simulate.step_model import ModelShape, Profile

    if not a.profile or not a.peaks_from:
        return fail("--calibrate-from needs --profile OUT and --peaks-from PROFILE (this machine's measured peaks)")
    raw = json.loads(Path(a.calibrate_from).read_text())
    sweep_path = Path(a.out) / "calibrate-from.steps.json"
    sweep_path.parent.mkdir(parents=True, exist_ok=True)
    sweep_path.write_text(json.dumps(raw["steps"]))
    rows, peaks = sweep.load_rows(sweep_path), Profile.load(a.peaks_from)
    shape = ModelShape.from_dir(cfg.model, cfg.dtype)
    settings = raw.get("settings", {})
    prof = calibrate.calibrate(rows, shape, peaks.bandwidth_gbps, peaks.peak_tflops(cfg.dtype), raw.get("engine", engine),
                               notes=f"steps timed by {a.calibrate_from} (offline generate, difference of two lengths "
                                     f"per decode point); settings read back {settings}; peaks from {a.peaks_from}",
                               fused_max_rows=int(settings.get("max_num_seqs") or 0),
                               share_kv=not any(any(n == 1 for n, _, _ in s.seqs) and any(n > 1 for n, _, _ in s.seqs)
                                                for s, _ in rows))  # no timed step mixes decodes and a prefill
    prof.version = str(raw.get("version", ""))
    prof.save(a.profile)
    f = prof.fit["sweep"]
    print(f"inferlab: profile written to {a.profile} ({f['steps']} steps, |error| median {f['median_abs']:.1%}, "
          f"p90 {f['p90_abs']:.1%})", file=sys.stderr)
    return 0
