"""Re-anchor a calibrated CPU profile on the machine's speed now (held-out round 5's lesson:
docs/perf/2026-12-07-heldout-round5.md).

On a shared VM the memory-bound speed moves by 10-20 % within an hour: a fit model's one-row decode step took 57.5
ms in round 5's calibration sweep, 50.5 ms at its test half an hour later and 47.4 ms an hour after that, while its
compute-bound prefills moved a few per cent. A profile is a measurement of the machine at a time, and a 35-minute
calibration cannot be redone before every prediction. So `anchor` times a model the profile was fitted on (its
one-row decode steps in-process, `probe.one_row_steps`: about 15 s) and scales the profile's memory-bound terms
(MEMORY) until the median of those steps comes out as measured; the compute terms stay as fitted. The factor, the
model and the time go into `Profile.anchored` and the profile's label, so every report made with it says so.

The anchor model must be one the profile was fitted on (else its transfer error would be read as the machine's
drift) and past the cache (else its steps do not read memory)."""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

from experiments.simulate.step_model import ModelShape, Profile, predict

MEMORY = ("weights", "kv", "kv_shared")  # the terms that read DRAM: what the host's neighbours slow down
LIMITS = (0.5, 2.0)  # a factor outside: not drift (another machine, a wrong model): recalibrate
SPREAD = 0.10  # server processes whose speeds differ by more than the simulator's bar: a sample, not the machine


def scaled(prof: Profile, factor: float) -> Profile:
    """A copy of the profile with the MEMORY coefficients times `factor`, in `coef` and in every regime."""
    def one(c: dict[str, float]) -> dict[str, float]:
        return {k: v * factor if k in MEMORY else v for k, v in c.items()}
    return replace(prof, coef=one(prof.coef), regimes={r: one(c) for r, c in prof.regimes.items()})


def stepped(s, m: ModelShape, p: Profile, served: bool) -> float:
    """A step's predicted seconds: in-process, or as a served engine runs it (plus the profile's served step terms)."""
    from experiments.simulate.served_overhead import served_step

    t = predict(s, m, p)
    return served_step(p, t, len(s.seqs)) if served else t


def factor(prof: Profile, runs: list[tuple[ModelShape, list]], limits: tuple[float, float] = LIMITS,
           served: bool = False) -> float:
    """The MEMORY scale at which each model's median predicted step of its `steps` [(StepShape, seconds)] comes out
    as its median measured one, in the geometric mean over the models (bisection: a step's time never falls as a term
    grows). Over two models of different shapes (held-out round 7 on), one model's own fit error is halved instead of
    read whole as the machine's drift (round 6: the control's drift read 15 %, the held-out model needed ~10 %).
    `served`: the steps ran in a served engine (a step log), so each prediction carries the served step terms."""
    want = [statistics.median(t for _, t in steps) for _, steps in runs]

    def gap(f: float) -> float:  # mean log(predicted / measured) over the models at scale f
        p = scaled(prof, f)
        return statistics.fmean(math.log(statistics.median(stepped(s, m, p, served) for s, _ in steps) / w)
                                for (m, steps), w in zip(runs, want))

    lo, hi = limits
    if not gap(lo) <= 0 <= gap(hi):
        raise ValueError(f"anchor: the measured steps ({', '.join(f'{w * 1e3:.1f}' for w in want)} ms) need the memory "
                         f"terms scaled outside x{lo}-x{hi}: not drift; recalibrate on this machine")
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def check(prof: Profile, m: ModelShape, model_dir: str | Path) -> None:
    """Refuse an anchor that cannot read the machine's memory speed against this profile."""
    if not prof.calibrated:
        raise ValueError(f"anchor: {prof.label} is a spec sheet, not a measurement: nothing to re-anchor")
    fitted = {sig for sig, _ in prof.fit.get("rows_per_model", [])}
    if m.signature not in fitted:
        raise ValueError(f"anchor: {model_dir} is not a model the profile was fitted on (its error there would be "
                         f"read as the machine's drift); fitted on: {'; '.join(sorted(fitted)) or 'none recorded'}")
    if m.weight_bytes <= prof.cache_bytes:
        raise ValueError(f"anchor: {model_dir} ({m.weight_bytes / 1e6:.0f} MB) reads its weights from the "
                         f"{prof.cache_bytes / 2**20:.0f} MiB cache, not memory: anchor on a model past it")


def anchor(prof: Profile, model_dir: str | Path | list, threads: int, prompt: int = 768, tokens: int = 48,
           skip: int = 10, dtype: str = "float32", limits: tuple[float, float] = LIMITS, rounds: int = 1) -> Profile:
    """The profile re-anchored on the one-row decode steps of `model_dir` (or of each of a list of model dirs) timed
    now (module docstring). `rounds` > 1 times the models in turn that many times and pools each model's steps: on a
    host whose memory speed swings by +-25 % within seconds (held-out round 7's machine: a fit model's one-row step
    31-48 ms a minute apart), one ~12 s sample per model is a lottery; pooled over ~2 minutes it reads the mean."""
    from experiments.simulate import probe

    dirs = [model_dir] if isinstance(model_dir, (str, Path)) else list(model_dir)
    shapes = [ModelShape.from_dir(d, dtype) for d in dirs]  # probe.one_row_steps runs float32
    for m, d in zip(shapes, dirs):
        check(prof, m, d)
    pooled: list[list] = [[] for _ in dirs]
    for _ in range(rounds):
        for steps, d in zip(pooled, dirs):
            steps += probe.one_row_steps(d, threads, tokens, skip, prompt)
    runs = list(zip(shapes, pooled))
    f = factor(prof, runs, limits)
    per = [{"model": str(d), "steps": len(steps), "measured_ms": statistics.median(t for _, t in steps) * 1e3,
            "predicted_ms": statistics.median(predict(s, m, prof) for s, _ in steps) * 1e3}
           for d, (m, steps) in zip(dirs, runs)]
    got = scaled(prof, f)
    got.anchored = {"utc": time.strftime("%H:%M:%S", time.gmtime()), "date": time.strftime("%Y-%m-%d"),
                    "model": " + ".join(p["model"] for p in per), "steps": sum(p["steps"] for p in per),
                    "threads": threads, "prompt": prompt, "rounds": rounds, "measured_ms": per[0]["measured_ms"],
                    "predicted_ms": per[0]["predicted_ms"], "factor": f, "terms": list(MEMORY)}
    if len(per) > 1:
        got.anchored["per_model"] = per
    return got


def served(prof: Profile, runs: list[tuple[str | Path, str | Path]], dtype: str = "float32",
           limits: tuple[float, float] = LIMITS) -> Profile:
    """The profile re-anchored on the decode steps that served engines of fit models logged (`[(model dir, step
    log)]`: `inferlab serve --step-log`, one pid per server process), each against its served prediction.

    Held-out round 7's lesson (docs/perf/2026-12-07-heldout-round7.md): the in-process probe (`anchor`) read two speeds
    ~40 % apart from one engine to the next and caught the slow one both times (x1.29, x1.32), while the test's servers
    ran within 4-6 % of the profile as calibrated all round: the anchor made every load prediction worse. A served
    run is the process the prediction is for, so its steps are the speed to anchor on; a run of several server
    processes (repeats) pools their steps, and `per_process_ms` records each one's median, so a process that landed in
    the other speed shows in the record instead of deciding the factor alone.

    Round 8's lesson (docs/perf/2026-12-07-heldout-round8.md): on that VM the fit models' server processes ran from -29 %
    to +14 % of the calibrated speed one process to the next, so two processes a model misread the machine as the
    probe had. `spread` is the fastest process's speed over the slowest's, less one (each process's median served
    prediction over its median measured step): above SPREAD the anchor is a sample of processes, not the machine,
    and the CLI says so."""
    from experiments.simulate import sweep
    from experiments.simulate.step_model import regime
    from reference_engine.engine.step_log import read

    pooled, per = [], []
    for d, log in runs:
        m = ModelShape.from_dir(d, dtype)
        check(prof, m, d)
        procs = {pid: [(s, t) for s, t in sweep.shapes(rows) if regime(s, prof.fused_max_rows) == "decode"]
                 for pid, rows in read(str(log)).items()}
        steps = [x for v in procs.values() for x in v]
        if not steps:
            raise ValueError(f"anchor: {log} holds no decode step of a served engine")
        pooled.append((m, steps))
        per.append({"model": str(d), "log": str(log), "steps": len(steps),
                    "measured_ms": statistics.median(t for _, t in steps) * 1e3,
                    "predicted_ms": statistics.median(stepped(s, m, prof, True) for s, _ in steps) * 1e3,
                    "per_process_ms": {str(k): statistics.median(t for _, t in v) * 1e3 for k, v in procs.items() if v},
                    "per_process_speed": {str(k): statistics.median(stepped(s, m, prof, True) for s, _ in v)
                                          / statistics.median(t for _, t in v) for k, v in procs.items() if v}})
    f = factor(prof, pooled, limits, served=True)
    speeds = [v for p in per for v in p["per_process_speed"].values()]
    got = scaled(prof, f)
    got.anchored = {"utc": time.strftime("%H:%M:%S", time.gmtime()), "date": time.strftime("%Y-%m-%d"),
                    "how": "served step log", "model": " + ".join(p["model"] for p in per),
                    "steps": sum(p["steps"] for p in per), "measured_ms": per[0]["measured_ms"],
                    "predicted_ms": per[0]["predicted_ms"], "factor": f, "terms": list(MEMORY), "per_model": per,
                    "spread": max(speeds) / min(speeds) - 1}
    return got


__all__ = ["MEMORY", "LIMITS", "SPREAD", "scaled", "stepped", "factor", "check", "anchor", "served"]
