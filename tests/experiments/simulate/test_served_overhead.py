"""The served overhead (served_overhead.py): fitted from per-level summaries, applied by the replica
to each step and by the simulated engine to each request, only when the engine is served."""
from __future__ import annotations

import pytest

from experiments.simulate import served_overhead
from experiments.simulate.replay import replay
from experiments.workload.config import load
from tests.experiments.exp_util import write_config
from tests.experiments.simulate.planted import PER_SEQ, PER_STEP, planted
from tests.experiments.simulate.test_replay import BODY, rows


def level(ttft_ms: float, tpot_ms: float) -> dict:
    return {"ttft_ms": {"median": ttft_ms}, "tpot_ms": {"median": tpot_ms}}


def test_fit_recovers_planted_overheads():
    """TPOT gap = 2 ms + 0.5 ms per stream; TTFT gap = that + 7 ms + 3 ms per other stream."""
    sim = {f"concurrency={b}": level(50.0, 20.0 + b) for b in (1, 3, 6)}
    meas = {f"concurrency={b}": level(50.0 + 7.0 + 3.0 * (b - 1) + 2.0 + 0.5 * b, 20.0 + b + 2.0 + 0.5 * b)
            for b in (1, 3, 6)}
    got = served_overhead.fit(meas, sim, steps=True, scaled=True)
    assert got == pytest.approx({"per_request_s": 7e-3, "per_request_per_seq_s": 3e-3, "per_step_s": 2e-3,
                                 "per_seq_s": 0.5e-3}, abs=1e-9)
    # by default the step terms stay 0 (drift, not overhead: served_overhead's docstring), and the request
    # term is a constant (a line through 1-6 streams does not hold at a Poisson level's 20-50): the mean gap
    got = served_overhead.fit(meas, sim)
    gaps = [7.0 + 3.0 * (b - 1) + 2.0 + 0.5 * b for b in (1, 3, 6)]
    assert got == pytest.approx({"per_request_s": sum(gaps) / 3e3, "per_request_per_seq_s": 0.0, "per_step_s": 0.0,
                                 "per_seq_s": 0.0}, abs=1e-9)


def test_a_served_core_faster_per_sequence_is_a_signed_correction_and_needs_closed_levels():
    sim = {f"concurrency={b}": level(50.0, 20.0) for b in (1, 4)}
    meas = {"concurrency=1": level(40.0, 25.0), "concurrency=4": level(40.0, 22.0)}  # gap falls with streams
    got = served_overhead.fit(meas, sim, steps=True)
    assert got["per_seq_s"] == pytest.approx(-1e-3) and got["per_step_s"] == pytest.approx(6e-3)
    assert got["per_request_s"] == 0.0  # TTFT 10 ms early: a request cannot arrive before it is sent
    prof = planted()
    served_overhead.apply(prof, got, "test")
    assert served_overhead.served_step(prof, 0.020, 4) == pytest.approx(0.022)
    assert served_overhead.served_step(prof, 0.020, 100) == pytest.approx(0.010)  # floor: half the prediction
    with pytest.raises(ValueError, match="closed-loop"):
        served_overhead.fit({"rate=1": level(1, 1), "rate=2": level(1, 1)}, {"rate=1": level(1, 1), "rate=2": level(1, 1)})


@pytest.mark.parametrize("mode", ["server", "in_process"])
def test_overhead_applies_to_a_served_engine_only(exp_model, tmp_path, mode):
    """One stream, 4 tokens: TTFT = request delay + one step; TPOT = one step; each step carries the
    step and per-sequence overhead when served, nothing when in-process."""
    path = write_config(tmp_path / "c.toml", exp_model, BODY.replace("concurrency = [1, 2]", "concurrency = [1]")
                        + f'[engine_options.reference]\nmode = "{mode}"\n')
    prof = planted()
    served_overhead.apply(prof, {"per_request_s": 0.005, "per_step_s": 0.002, "per_seq_s": 0.0005}, "test")
    run = replay(load(path), path.read_text(), prof, tmp_path / "out")
    step = PER_STEP + PER_SEQ + ((0.002 + 0.0005) if mode == "server" else 0.0)
    req = 0.005 if mode == "server" else 0.0
    for r in rows(run, "concurrency=1"):
        assert r["ttft_ms"] == pytest.approx((req + step) * 1e3, abs=1e-6)
        assert r["tpot_ms"] == pytest.approx(step * 1e3, abs=1e-6)


def test_fit_steps_recovers_planted_step_terms_robustly():
    """Served steps = their planted prediction + 2 ms + 0.5 ms per sequence; one step per batch size a
    neighbour's 50 ms burst, which the median per batch size ignores."""
    from experiments.simulate.step_model import ModelShape, StepShape, predict

    m, prof = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=256,
                         dtype="float32"), planted()
    rows = []
    for b in (1, 2, 3, 6, 8):
        for i in range(9):
            s = StepShape(tuple((1, 10 + i + j, 1) for j in range(b)))
            rows.append((s, predict(s, m, prof) + 2e-3 + 0.5e-3 * b + (50e-3 if i == 4 else 0.0)))
    assert served_overhead.fit_steps(rows, m, prof, scaled=True) == pytest.approx(
        {"per_step_s": 2e-3, "per_seq_s": 0.5e-3}, abs=1e-9)
    # by default a constant: the median gaps per batch size (2.5, 3, 3.5, 5, 6 ms), weighted by their counts
    assert served_overhead.fit_steps(rows, m, prof) == pytest.approx({"per_step_s": 4e-3, "per_seq_s": 0.0},
                                                                      abs=1e-9)
    # served steps faster than the prediction, more so with more sequences: no negative overhead
    faster = [(s, predict(s, m, prof) - 1e-3 * len(s.seqs)) for s, _ in rows]
    assert served_overhead.fit_steps(faster, m, prof, scaled=True) == {"per_step_s": 0.0, "per_seq_s": 0.0}
    assert served_overhead.fit_steps(faster, m, prof) == {"per_step_s": 0.0, "per_seq_s": 0.0}
    with pytest.raises(ValueError, match="2 batch sizes"):
        served_overhead.fit_steps([r for r in rows if len(r[0].seqs) == 1], m, prof)


def test_fit_served_with_a_step_log_end_to_end(exp_model, tmp_path):
    """`inferlab simulate CFG --fit-served RUN --steps-log LOG`: the "measured" run is the config served by a
    planted engine with 4 ms per request and 2 ms per step (a simulated run folder
    stands in for the measurement: its times are exact); the log holds that engine's steps. The fit reads
    the step terms off the log and the request term off the run."""
    import json
    import shutil
    from types import SimpleNamespace

    from experiments.cli import main
    from experiments.simulate import sweep
    from experiments.simulate.step_model import ModelShape, predict

    path = write_config(tmp_path / "c.toml", exp_model, BODY + '[engine_options.reference]\nmode = "server"\n')
    truth = planted()
    served_overhead.apply(truth, {"per_request_s": 4e-3, "per_step_s": 2e-3}, "planted")
    sim = replay(load(path), path.read_text(), truth, tmp_path / "sim")
    shutil.copytree(sim / "reference-simulated", tmp_path / "meas" / "reference")
    m, log = ModelShape.from_dir(exp_model, "float32"), tmp_path / "steps.jsonl"
    recs = [SimpleNamespace(pid=1, t=float(n), step=n, prefix_hits={}, preempted=[], finished=[], spec_proposed={},
                            spec_accepted={}, scheduled=[(f"r{i}", 1, "decode") for i in range(b)],
                            new_tokens={f"r{i}": 1 for i in range(b)}, duration_s=0.0)
            for n, b in enumerate((1, 2, 2, 1, 2) * 3)]
    for rec, (s, _) in zip(recs, sweep.shapes(recs)):  # its planted in-process time plus the served terms
        rec.duration_s = predict(s, m, planted()) + 2e-3
    log.write_text("".join(json.dumps(vars(r)) + "\n" for r in recs))
    prof_path = tmp_path / "profile.json"
    planted().save(prof_path)
    assert main(["simulate", str(path), "--profile", str(prof_path), "--fit-served", str(tmp_path / "meas"),
                 "--steps-log", str(log), "--out", str(tmp_path / "fit")]) == 0
    got = json.loads(prof_path.read_text())["served"]
    assert {k: got[k] for k in ("per_step_s", "per_seq_s", "per_request_s")} == pytest.approx(
        {"per_step_s": 2e-3, "per_seq_s": 0.0, "per_request_s": 4e-3}, abs=1e-6)
    assert "step log" in got["source"]
    assert "step_spread" not in got  # off unless asked
    # --step-spread: the steps' own spread, fitted on the log; asked without a log, one line and exit 2
    _decode_log(log, m, served_overhead.apply(planted(), {"per_step_s": 2e-3}, "planted"), {1: 1.0, 2: 0.7}, 0.12)
    assert main(["simulate", str(path), "--profile", str(prof_path), "--fit-served", str(tmp_path / "meas"),
                 "--steps-log", str(log), "--step-spread", "--out", str(tmp_path / "fit2")]) == 0
    assert json.loads(prof_path.read_text())["served"]["step_spread"] == pytest.approx(0.12, rel=0.15)
    assert main(["simulate", str(path), "--profile", str(prof_path), "--fit-served", str(tmp_path / "meas"),
                 "--step-spread", "--out", str(tmp_path / "fit3")]) == 2


def _decode_log(path, m, prof, speeds: dict[int, float], sigma: float, seed: int = 5) -> None:
    """A step log of decode steps (1, 2 and 4 rows) per process, each step its served prediction times the
    process's speed times exp(N(0, sigma))."""
    import json
    import math
    import random
    from types import SimpleNamespace

    from experiments.simulate import sweep
    from experiments.simulate.step_model import predict

    rng, lines = random.Random(seed), []
    for pid, speed in speeds.items():
        recs = [SimpleNamespace(pid=pid, t=float(n), step=n, prefix_hits={}, preempted=[], finished=[], spec_proposed={},
                                spec_accepted={}, scheduled=[(f"r{i}", 1, "decode") for i in range(b)],
                                new_tokens={f"r{i}": 1 for i in range(b)}, duration_s=0.0)
                for n, b in enumerate((1, 2, 4) * 100)]
        for rec, (s, _) in zip(recs, sweep.shapes(recs)):
            rec.duration_s = (served_overhead.served_step(prof, predict(s, m, prof), len(s.seqs)) * speed
                              * math.exp(rng.gauss(0.0, sigma)))
        lines += [json.dumps(vars(r)) for r in recs]
    path.write_text("\n".join(lines) + "\n")


def test_fit_spread_takes_each_processs_speed_out_and_recovers_a_planted_sigma(tmp_path):
    """Two server processes 60 % apart in speed (round 8's were 43 points apart), each step 12 % astray: the spread
    is the steps' own (pooled with the processes' speeds in, it would read ~0.25)."""
    from experiments.simulate.step_model import ModelShape

    m = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=256, dtype="float32")
    prof = served_overhead.apply(planted(), {"per_step_s": 2e-3}, "planted")
    log = tmp_path / "steps.jsonl"
    _decode_log(log, m, prof, {1: 0.8, 2: 1.3}, 0.12)
    assert served_overhead.fit_spread(str(log), m, prof) == pytest.approx(0.12, rel=0.15)
    _decode_log(log, m, prof, {1: 0.8, 2: 1.3}, 0.0)  # every step exactly its process's speed: no spread
    assert served_overhead.fit_spread(str(log), m, prof) == pytest.approx(0.0, abs=1e-9)
    log.write_text(log.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match="need 10"):
        served_overhead.fit_spread(str(log), m, prof)


def test_jitter_keeps_the_mean_and_draws_nothing_without_a_spread():
    import math
    import random
    import statistics

    prof, rng = planted(), random.Random(0)
    assert served_overhead.jitter(prof, rng) == 1.0 and rng.random() == random.Random(0).random()
    served_overhead.apply(prof, {"step_spread": 0.2}, "test")
    xs = [served_overhead.jitter(prof, rng) for _ in range(20000)]
    assert statistics.fmean(xs) == pytest.approx(1.0, abs=0.01)  # a request's TPOT, a mean of steps, keeps its expectation
    assert statistics.median(xs) == pytest.approx(math.exp(-0.02), abs=0.01)
    assert statistics.stdev(math.log(x) for x in xs) == pytest.approx(0.2, rel=0.05)


LINEAR = 200.0  # a prefill token costs what a decode row does several times over


def test_a_step_spread_unlocks_a_simulated_closed_loop(exp_model, tmp_path):
    """Three streams whose prompts take two steps' budget (one chunk lags), every step priced exactly: the streams
    settle into one phase and the TTFTs take a few values (held-out round 9: 42 of 48 at two values). With the
    served steps' spread the phases drift and the TTFTs spread out; the mean TPOT stays within a few percent."""
    import statistics

    body = (BODY.replace("concurrency = [1, 2]", "concurrency = [3]").replace("num_requests = 3", "num_requests = 30")
            .replace("output_len = 4", "output_len = 12")
            + '[engine_options.reference]\nmode = "server"\nmax_num_batched_tokens = 48\n')
    path = write_config(tmp_path / "c.toml", exp_model, body)
    got = {}
    for sigma in (0.0, 0.2):
        prof = served_overhead.apply(planted(linear=LINEAR), {"per_request_s": 0.003, "step_spread": sigma}, "test")
        got[sigma] = rows(replay(load(path), path.read_text(), prof, tmp_path / f"out{sigma}"), "concurrency=3")
    ttfts = {s: {round(r["ttft_ms"], 3) for r in rs} for s, rs in got.items()}
    # exact steps: the 30 TTFTs repeat a handful of values (here 6); drawn steps: nearly every request its own
    assert len(ttfts[0.0]) <= len(got[0.0]) // 5 and len(ttfts[0.2]) >= 0.8 * len(got[0.2])
    tpot = {s: statistics.fmean(r["tpot_ms"] for r in rs) for s, rs in got.items()}
    assert tpot[0.2] == pytest.approx(tpot[0.0], rel=0.05)
