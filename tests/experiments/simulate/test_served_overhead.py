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
