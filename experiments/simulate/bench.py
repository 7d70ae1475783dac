"""`make simulate-bench`: the simulator's validation (issue 40), predict first, measure second.

    python -m experiments.simulate.bench [--out DIR] [--measured DIR] [--skip-published]

1. calibrate the reference engine on this CPU (`inferlab simulate --calibrate`), the profile and each
   workload's greedy EOS lengths under DIR/;
2. step level, teacher-forced: the engine serves the served config's prompts at 4 streams in-process
   (its own step records: every batch it formed, timed); each step predicted from its shape;
3. predict, then measure (`inferlab run`, skipped for a config already measured under --measured):
   closed loop 1/4/8 (bench/served.toml), the SLO search (bench/search.toml), then Poisson at 50, 85
   and 95 % of the measured search capacity;
4. the published table (H200 spec profile vs TensorRT-LLM) and 10^5 requests over 8 replicas;
5. DIR/bench.json and DIR/bench.md (the tables docs/perf/2026-12-04-simulate.md quotes), and merged
   reports with the "Predicted vs measured" section: DIR/merged-<name>/report.md.

Timing bars are not asserted here: the page reads them, with the machine's load noted.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent / "bench"
PY = [sys.executable, "-m", "experiments.cli"]
LOADS = (0.5, 0.85, 0.95)


LOAD: dict[str, tuple[float, float, float]] = {}  # the machine's load average as each phase began


def sh(*args: str) -> None:
    LOAD[" ".join(args[:2])] = os.getloadavg()
    print("+ inferlab " + " ".join(args), file=sys.stderr, flush=True)
    subprocess.run(PY + list(args), check=True)


def lengths_for(config: Path, out: Path) -> Path:
    """The config's workload's greedy EOS lengths (the engine, offline): what the simulator may know."""
    from experiments import workloads
    from experiments.config import load
    from experiments.simulate import sweep

    cfg = load(config)
    items, warm = workloads.build(cfg.model, cfg.workload, cfg.load.warmup)
    ecfg = sweep.engine_config(cfg.model, cfg.dtype, {}, kv_cache_tokens=65536, max_model_len=4096)
    path = out / f"{cfg.name}-lengths.json"
    path.write_text(json.dumps(sweep.eos_lengths(ecfg, items + warm, cfg.sampling.ignore_eos), indent=1))
    return path


def teacher_forced(config: Path, profile_path: Path) -> dict:
    from experiments import workloads
    from experiments.config import load
    from experiments.simulate import calibrate, sweep
    from experiments.simulate.step_model import ModelShape, Profile

    cfg, prof = load(config), Profile.load(profile_path)
    items, _ = workloads.build(cfg.model, cfg.workload, 0)
    threads = max(1, (os.cpu_count() or 2) - 1)  # as `inferlab serve` runs, as calibrated
    ecfg = sweep.engine_config(cfg.model, cfg.dtype, {}, kv_cache_tokens=cfg.kv.tokens, num_threads=threads)
    cpu, wall = sweep.trace(ecfg, [it.prompt_token_ids for it in items], [it.output_len for it in items], 4,
                            cfg.sampling.ignore_eos)
    shape = ModelShape.from_dir(cfg.model, cfg.dtype)
    out = {}
    for clock, rows in (("cpu", cpu), ("wall", wall)):
        decode = [(s, d) for s, d in rows if all(n == 1 for n, _, _ in s.seqs)]
        mixed = [(s, d) for s, d in rows if any(n > 1 for n, _, _ in s.seqs)]
        out.update({f"{clock}: all": calibrate.errors(rows, shape, prof),
                    f"{clock}: decode only": calibrate.errors(decode, shape, prof),
                    f"{clock}: with prefill": calibrate.errors(mixed, shape, prof)})
    return out


def poisson_config(search_cfg: Path, rates: list[float], out: Path) -> Path:
    text = search_cfg.read_text().replace('name = "sim_search"', 'name = "sim_poisson"')
    text = text.replace('mode = "search"', f'mode = "open"\nrate = [{", ".join(f"{r:.3f}" for r in rates)}]')
    path = out / "poisson.toml"
    path.write_text(text)
    return path


def summary(run: Path, engine: str) -> dict:
    return json.loads((run / engine / "summary.json").read_text())["levels"]


def search_rate(run: Path, engine: str) -> float | None:
    m = json.loads((run / engine / "manifest.json").read_text())
    return ((m.get("repeats") or {}).get("1") or {}).get("search", {}).get("best_rate")


def compare(measured: Path, predicted: Path, name: str, out: Path) -> dict:
    from experiments.report.predicted import errors

    m, p = summary(measured / name, "reference"), summary(predicted / f"{name}-simulated", "reference-simulated")
    sh("report", str(measured / name), str(predicted / f"{name}-simulated"), "--out", str(out / f"merged-{name}"))
    return {lv: {"errors": errors(m[lv], p[lv]),
                 "measured": {k: m[lv][k] for k in ("ttft_ms", "tpot_ms", "e2el_ms", "output_throughput")},
                 "predicted": {k: p[lv][k] for k in ("ttft_ms", "tpot_ms", "e2el_ms", "output_throughput")}}
            for lv in m if lv in p}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.simulate.bench")
    ap.add_argument("--out", default="results/simulate-bench")
    ap.add_argument("--measured", help="a folder holding measured runs to reuse (sim_served, sim_search, ...)")
    ap.add_argument("--skip-published", action="store_true")
    a = ap.parse_args(argv)
    from experiments.config import load

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meas = Path(a.measured) if a.measured else out / "measured"
    pred = out / "predicted"
    res: dict = {"load_at_start": os.getloadavg(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    served, search = HERE / "served.toml", HERE / "search.toml"
    prof = out / "profile-reference.json"
    if not prof.is_file():
        sh("simulate", str(served), "--calibrate", "--profile", str(prof))
    res["profile"] = json.loads(prof.read_text())
    res["teacher_forced"] = teacher_forced(served, prof)
    print(f"teacher-forced: {res['teacher_forced']}", file=sys.stderr)
    for cfg in (served, search):
        lens = lengths_for(cfg, out)
        sh("simulate", str(cfg), "--profile", str(prof), "--lengths", str(lens), "--out", str(pred))
        if not (meas / load(cfg).name).is_dir():
            sh("run", str(cfg), "--out", str(meas), "--no-progress")
    res["served"] = compare(meas, pred, "sim_served", out)
    cap = search_rate(meas / "sim_search", "reference")
    res["capacity"] = {"measured": cap, "predicted": search_rate(pred / "sim_search-simulated", "reference-simulated")}
    if cap:
        pcfg = poisson_config(search, [f * cap for f in LOADS], out)
        lens = lengths_for(pcfg, out)
        sh("simulate", str(pcfg), "--profile", str(prof), "--lengths", str(lens), "--out", str(pred))
        if not (meas / "sim_poisson").is_dir():
            sh("run", str(pcfg), "--out", str(meas), "--no-progress")
        res["poisson"] = compare(meas, pred, "sim_poisson", out)
    if not a.skip_published:
        from experiments.simulate import published
        from experiments.simulate.step_model import load_profile

        h200 = load_profile("h200")
        res["published"] = {"source": published.SOURCE, "rows": published.table(h200)}
        res["at_scale"] = published.at_scale(h200, osl=64, names=("least_loaded",)) + \
            published.at_scale(h200, n=20_000, rate=100.0, replicas=2, osl=64)
    res["load_at_end"], res["load_by_phase"] = os.getloadavg(), LOAD
    (out / "bench.json").write_text(json.dumps(res, indent=2, default=str))
    print(f"bench written to {out / 'bench.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
