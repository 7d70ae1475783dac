"""The served overhead: what a served reference engine adds to the engine core's step times.

The step-time model is calibrated in-process (`LLMEngine.step`, wall clock). Served, each step also
carries the engine-core process's pipe (one message of batched deltas per step), the front end's
work per sequence per step (detokenization, one SSE event per stream; on a 2-core machine that work
competes with the core's 2 threads) and, per request, the HTTP request, the chat template and the
`AddRequest` message before the request reaches the scheduler, plus the first token's trip back.
Three terms, in the profile's `served`:

    step time (served) = predict(step) + per_step_s + per_seq_s * B
    a request enters the scheduler per_request_s + per_request_per_seq_s * R after it was sent
    (R: requests the replica holds when it arrives: the front end parses it while it streams theirs)

They are fitted on a measured served *calibration* run (its own config and seed: never the run the
prediction is validated on) against the same run simulated without them, with the answers' measured
lengths (so only timing differs). **By default only the constants** (per_request_s, per_step_s; the two
terms that grow with load stay 0, `scaled=True` fits them). The calibration run is closed loop at 1-6
streams, and a line through it was extrapolated to the 20-50 sequences of a sustained Poisson level: on the
AMX Xeon (2026-12-05, docs/perf/2026-12-05-simulate-7.md) it fitted 2.3 ms per held request and 0.21 ms
per sequence per step, put ~44 ms of front end before each request and +4 ms on each step at 8.5 req/s,
and predicted TTFT +17 / +60 / +55 % and TPOT +0 / +19 / +13 % at 50 / 85 / 95 % load. The served
steps of that run, measured, sit ~1 ms over their in-process prediction at every batch size from 1 to 50,
and the requests reach the core at the first step boundary after a ~2 ms front end: the overhead there
does not grow with load. With the scaled terms off, the same prediction read TTFT -7 / +5 / -2 %.
  - per_request_s, per_request_per_seq_s: the p50 TTFT gap per level, less the step overhead its
    first step already carries, against the other streams (B - 1) the front end serves meanwhile
    (least squares, both >= 0: a request cannot reach the scheduler before it was sent);
  - per_step_s, per_seq_s, from the run's step log (`inferlab serve --step-log`, `fit_steps`): every step the
    served engine core ran, its wall time less its in-process prediction; the median of that per batch
    size B, and a line through the medians (weighted by their counts, both terms >= 0). This measures the
    step itself, served: what the front end's and the client's CPU work takes from the core's 2 threads
    on a 2-core machine. The medians per B are measured on the engine's own steps, not inferred from
    TPOT, so a queue, a preemption or the machine's drift between levels does not enter them; drift
    between processes still does (each served process has its own speed: the bench reports it);
  - per_step_s, per_seq_s without a step log, only when asked (`fit(..., steps=True)`): the p50 TPOT gap per closed-loop
    level against the level's streams B (least squares, signed; a step never costs less than half its
    in-process prediction). Off by default since 2026-12-05. They were added when every served run
    decoded faster per sequence than the in-process calibration (-0.8 to -1.6 ms per sequence per
    step); the cause was the calibration, which sampled every row at temperature 1 (a softmax and a
    draw over the vocabulary) while the served runs were greedy. With a greedy calibration the
    in-process profile predicts the served 4- and 8-stream TPOT within 3 % without them, and what a
    fit still finds is the machine's drift: the same server config decoded one stream at 20.0 and then
    23.1 ms per token two minutes apart, and a line through three such points, extrapolated to the 20-30
    sequences of a Poisson level, put +18-27 % on its TPOT (docs/perf/2026-12-05-simulate-3.md).
  - step_spread (not seconds: a log-normal sigma), from the same step log (`fit_spread`): how far a served step
    strays from its prediction, each process's own speed taken out first (log of measured / predicted, less the
    process's median; 1.4826 x the median absolute deviation, pooled). The replica draws each served step's time
    around its prediction with it (`jitter`: mean one, so a request's TPOT, an average over its steps, keeps its
    expectation). Without it every simulated step costs exactly its prediction and a closed loop's streams lock
    into a fixed phase: held-out round 9's simulated 3-stream TTFTs took two values for 42 of 48 requests (1,248 and
    1,838 ms), the measured ones spread from 626 to 1,802 ms; the p50 missed by 19 % with the means within 2 %
    (docs/perf/2026-12-07-heldout-round9.md). A profile without it (0) prices every step exactly, as before.
    Off by default (`inferlab simulate --fit-served RUN --steps-log LOG --step-spread` fits it): re-simulated after
    round 9 with the spread of its fit suite's served steps (the 24 MB model's, 23 %), the closed loop's TTFT p50
    came within 1-6 % but the Poisson TTFT p50 moved from +5-7 % to +16-18 % (a request waits out a longer residual
    step); the held-out model's own served steps strayed 10-16 %. Which model's spread transfers is a round's question.
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np

from experiments.simulate.step_model import Profile

TERMS = ("per_request_s", "per_request_per_seq_s", "per_step_s", "per_seq_s")


def levels(run: Path, engine: str) -> dict[str, dict]:
    return json.loads((run / engine / "summary.json").read_text())["levels"]


def _streams(level: str) -> int:
    """Closed-loop level names are "concurrency=N"."""
    if not level.startswith("concurrency="):
        raise ValueError(f"served overhead: fit on closed-loop levels (concurrency=N), not {level!r}")
    return int(level.split("=", 1)[1])


def fit(measured: dict[str, dict], simulated: dict[str, dict], steps: bool = False,
        scaled: bool = False) -> dict[str, float]:
    """The terms from per-level summaries of the same run, measured and simulated without them; the step
    terms only with `steps`, the per-held-request term only with `scaled` (module docstring: 0 otherwise)."""
    lv = sorted((lv for lv in measured if lv in simulated), key=_streams)
    if len(lv) < 2:
        raise ValueError("served overhead: need at least 2 closed-loop levels measured and simulated")
    B = np.array([_streams(x) for x in lv], dtype=float)
    gap = np.array([(measured[x]["tpot_ms"]["median"] - simulated[x]["tpot_ms"]["median"]) / 1e3 for x in lv])
    A = np.column_stack([np.ones_like(B), B])
    sol, *_ = np.linalg.lstsq(A, gap, rcond=None)
    step, seq = (float(sol[0]), float(sol[1])) if steps else (0.0, 0.0)
    ttft = np.array([(measured[x]["ttft_ms"]["median"] - simulated[x]["ttft_ms"]["median"]) / 1e3 for x in lv])
    ttft -= step + seq * B
    others = B - 1
    r, *_ = np.linalg.lstsq(np.column_stack([np.ones_like(B), others]), ttft, rcond=None)
    if not scaled:
        r = np.array([max(0.0, float(ttft.mean())), 0.0])
    elif r[1] < 0:
        r = np.array([max(0.0, float(ttft.mean())), 0.0])
    elif r[0] < 0:
        r = np.array([0.0, max(0.0, float((others @ ttft) / (others @ others)))])
    return {"per_request_s": float(r[0]), "per_request_per_seq_s": float(r[1]), "per_step_s": step, "per_seq_s": seq}


def logged_rows(path: str) -> list:
    """A step log's steps as (StepShape, seconds), every process's in turn."""
    from experiments.simulate import sweep
    from reference_engine.engine.step_log import read

    return [r for steps in read(path).values() for r in sweep.shapes(steps)]


def fit_steps(rows: list, m, prof: Profile, scaled: bool = False) -> dict[str, float]:
    """per_step_s, per_seq_s from served steps (module docstring): seconds added to a step's in-process
    prediction, as a + b * B with `scaled`, else a constant (b = 0: the weighted mean of the medians)."""
    from experiments.simulate.step_model import predict

    by: dict[int, list[float]] = {}
    for s, d in rows:
        by.setdefault(len(s.seqs), []).append(d - predict(s, m, prof))
    if len(by) < 2:
        raise ValueError("served steps: need steps of at least 2 batch sizes")
    B = np.array(sorted(by), dtype=float)
    med = np.array([np.median(by[int(b)]) for b in B])
    w = np.sqrt([len(by[int(b)]) for b in B])
    A = np.column_stack([np.ones_like(B), B])
    sol, *_ = np.linalg.lstsq(A * w[:, None], med * w, rcond=None)
    if sol[1] < 0 or not scaled:  # no per-sequence cost: a constant
        sol = np.array([float(np.average(med, weights=w * w)), 0.0])
    elif sol[0] < 0:  # no per-step cost: through the origin
        sol = np.array([0.0, float(((B * w) @ (med * w)) / ((B * w) @ (B * w)))])
    sol = np.maximum(sol, 0.0)
    return {"per_step_s": float(sol[0]), "per_seq_s": float(sol[1])}


def fit_spread(path: str, m, prof: Profile) -> float:
    """step_spread from a step log (module docstring): the robust sigma of log(served step / its served
    prediction) about each process's median, over every process's steps."""
    from experiments.simulate import sweep
    from experiments.simulate.step_model import predict
    from reference_engine.engine.step_log import read

    dev = []
    for steps in read(path).values():
        x = np.array([math.log(d / served_step(prof, predict(s, m, prof), len(s.seqs)))
                      for s, d in sweep.shapes(steps) if d > 0])
        if len(x):
            dev += list(x - np.median(x))
    if len(dev) < 10:
        raise ValueError(f"served step spread: {len(dev)} steps in {path}, need 10 at least")
    return float(1.4826 * np.median(np.abs(dev)))


def jitter(prof: Profile, rng: random.Random) -> float:
    """A served step's time over its prediction: log-normal with the profile's step_spread and mean one; exactly
    1.0 (and no draw) without a spread."""
    sigma = float((prof.served or {}).get("step_spread", 0.0))
    return math.exp(rng.gauss(0.0, sigma) - sigma * sigma / 2) if sigma > 0 else 1.0


def apply(prof: Profile, terms: dict[str, float], source: str) -> Profile:
    prof.served = {**{k: float(terms.get(k, 0.0)) for k in TERMS}, "source": source}
    if terms.get("step_spread"):
        prof.served["step_spread"] = float(terms["step_spread"])
    return prof


def served_step(prof: Profile, seconds: float, seqs: int) -> float:
    """A step's served duration from its in-process prediction (at least half of it)."""
    s = prof.served or {}
    return max(0.5 * seconds, seconds + float(s.get("per_step_s", 0.0)) + float(s.get("per_seq_s", 0.0)) * seqs)


def request_delay(prof: Profile, held: int = 0) -> float:
    """Seconds from a request's send to the scheduler, `held` requests already in the replica."""
    s = prof.served or {}
    return float(s.get("per_request_s", 0.0)) + float(s.get("per_request_per_seq_s", 0.0)) * held
