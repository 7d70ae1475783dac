"""Re-anchoring a calibrated profile on the machine's speed now (anchor.py; held-out round 5: a fit model's one-row
step 57.5 ms in the calibration sweep, 50.5 ms at the test): only the memory-bound terms move, the factor is the one
that makes the anchor model's measured steps come out, and an anchor that cannot read the drift is refused."""
from __future__ import annotations

import json
import statistics

import pytest

from experiments.cli import main
from experiments.simulate import anchor, probe, sweep
from experiments.simulate.step_model import ModelShape, StepShape, predict
from reference_engine.engine.step_log import read as read_log
from tests.experiments.exp_util import write_config
from tests.experiments.simulate.planted import planted

BIG = ModelShape(layers=16, hidden=1280, heads=10, kv_heads=2, head_dim=128, intermediate=3584, vocab=40960)
ONE_ROW = [StepShape(((1, c, 1),)) for c in range(700, 800, 4)]


def fitted_on(m: ModelShape, **coef):
    prof = planted(weights=1.0, kv=1.0, linear_add=1.0, **coef)
    prof.fit = {"rows_per_model": [[m.signature, 100]]}
    prof.regimes = {"decode": dict(prof.coef), "mixed": {**prof.coef, "attention": 3.0}}
    return prof


def test_only_the_memory_terms_are_scaled_everywhere():
    prof = fitted_on(BIG)
    got = anchor.scaled(prof, 0.8)
    for before, after in [(prof.coef, got.coef), *((prof.regimes[r], got.regimes[r]) for r in prof.regimes)]:
        for k, v in before.items():
            assert after[k] == pytest.approx(v * 0.8 if k in anchor.MEMORY else v)
    assert prof.coef["weights"] == 1.0  # the original is left as it was


def test_the_factor_recovers_a_planted_drift():
    """Steps timed on a machine whose memory reads take 0.85x the calibration's: the anchor finds 0.85, and the
    re-anchored profile predicts those steps, including the terms it did not scale."""
    prof = fitted_on(BIG)
    now = anchor.scaled(prof, 0.85)
    steps = [(s, predict(s, BIG, now)) for s in ONE_ROW]
    f = anchor.factor(prof, [(BIG, steps)])
    assert f == pytest.approx(0.85, rel=1e-6)
    again = anchor.scaled(prof, f)
    assert all(predict(s, BIG, again) == pytest.approx(t, rel=1e-6) for s, t in steps)
    assert predict(s := ONE_ROW[0], BIG, prof) > predict(s, BIG, again)  # the drift: faster now


def test_over_two_models_the_factor_is_their_geometric_mean():
    """Held-out round 7: one model's memory reads run 0.80x the calibration's, another's 0.90x (its own fit error on
    top of the drift): each alone gives its own factor; anchored over both, the factor sits between them and the two
    models' predicted/measured ratios multiply to one (the geometric mean), instead of one taken whole."""
    prof = fitted_on(BIG)
    deep = ModelShape(layers=48, hidden=768, heads=12, kv_heads=4, head_dim=64, intermediate=2048, vocab=32768)
    prof.fit["rows_per_model"].append([deep.signature, 100])
    a = [(s, predict(s, BIG, anchor.scaled(prof, 0.80))) for s in ONE_ROW]
    b = [(s, predict(s, deep, anchor.scaled(prof, 0.90))) for s in ONE_ROW]
    assert anchor.factor(prof, [(BIG, a)]) == pytest.approx(0.80, rel=1e-6)
    assert anchor.factor(prof, [(deep, b)]) == pytest.approx(0.90, rel=1e-6)
    both = anchor.factor(prof, [(BIG, a), (deep, b)])
    at = anchor.scaled(prof, both)

    def ratio(m, steps):  # the model's median predicted step at the factor over its measured one
        return statistics.median(predict(s, m, at) for s, _ in steps) / statistics.median(t for _, t in steps)
    ra, rb = ratio(BIG, a), ratio(deep, b)
    assert 0.80 < both < 0.90 and ra > 1.02 and rb < 0.98  # each model off its own, the other way
    assert ra * rb == pytest.approx(1.0, rel=1e-6)  # the geometric mean of the two ratios is one


def test_a_factor_outside_the_limits_is_not_drift():
    prof = fitted_on(BIG)
    steps = [(s, predict(s, BIG, prof) * 5) for s in ONE_ROW]  # five times slower: another machine
    with pytest.raises(ValueError, match="recalibrate"):
        anchor.factor(prof, [(BIG, steps)])


def test_an_anchor_that_cannot_read_the_drift_is_refused():
    prof = fitted_on(BIG)
    other = ModelShape(layers=48, hidden=768, heads=12, kv_heads=4, head_dim=64, intermediate=2048, vocab=32768)
    with pytest.raises(ValueError, match="not a model the profile was fitted on"):
        anchor.check(prof, other, "deep")
    prof.cache_bytes = 2 * BIG.weight_bytes
    with pytest.raises(ValueError, match="reads its weights from the"):
        anchor.check(prof, BIG, "mid")
    prof.cache_bytes, prof.calibrated = 0, False
    with pytest.raises(ValueError, match="spec sheet"):
        anchor.check(prof, BIG, "mid")


def test_anchoring_times_the_engine_and_labels_the_profile(exp_model):
    """End to end on the engine's own steps, timed in the call: with the weight read the profile's only term, every
    one-row step is predicted factor x the read, so the factor found must put that on the measured median."""
    m = ModelShape.from_dir(exp_model)
    prof = planted(weights=1.0, per_step=0.0, per_seq=0.0)
    prof.fit = {"rows_per_model": [[m.signature, 10]]}
    read = m.weight_bytes / (prof.bandwidth_gbps * 1e9)
    got = anchor.anchor(prof, exp_model, threads=1, prompt=32, tokens=12, skip=2, limits=(1e-6, 1e6))
    x = got.anchored
    assert x["steps"] == 2 * (12 - 1 - 2) and x["model"] == str(exp_model) and x["terms"] == list(anchor.MEMORY)
    pooled = anchor.anchor(prof, exp_model, threads=1, prompt=32, tokens=12, skip=2, limits=(1e-6, 1e6), rounds=3)
    assert pooled.anchored["steps"] == 3 * x["steps"] and pooled.anchored["rounds"] == 3  # each turn's steps pooled
    assert x["factor"] * read * 1e3 == pytest.approx(x["measured_ms"], rel=1e-6)
    assert x["predicted_ms"] == pytest.approx(read * 1e3) and got.coef["weights"] == pytest.approx(x["factor"])
    assert "anchored x" in got.label and not prof.anchored


def test_the_run_says_its_profile_was_anchored(exp_model, tmp_path):
    from experiments.simulate.replay import replay
    from experiments.workload.config import load

    cfg = write_config(tmp_path / "c.toml", exp_model, BODY)
    m = ModelShape.from_dir(exp_model)
    prof = planted(weights=1.0)
    prof.fit = {"rows_per_model": [[m.signature, 10]]}
    steps = [(s, predict(s, m, anchor.scaled(prof, 0.9))) for s in ONE_ROW]
    got = anchor.scaled(prof, anchor.factor(prof, [(m, steps)]))
    got.anchored = {"factor": 0.9, "utc": "06:26:00", "model": str(exp_model)}
    run = replay(load(cfg), cfg.read_text(), got, tmp_path / "out")
    man = json.loads(next(run.glob("*/manifest.json")).read_text())
    assert man["simulated"]["anchored"]["factor"] == 0.9 and "anchored x0.900 at 06:26:00" in man["simulated"]["profile"]


BODY = '\nengine = "reference"\n[workload]\nkind = "random"\nnum_requests = 4\ninput_len = 16\noutput_len = 4\n[kv]\ntokens = 2048\n'


def test_the_cli_refuses_a_bad_anchor_in_one_line(exp_model, tmp_path, capsys):
    cfg = write_config(tmp_path / "c.toml", exp_model, BODY)
    prof = tmp_path / "p.json"
    planted(weights=1.0).save(prof)
    for model, says in [("/no/such/model", "no config.json"), (str(exp_model), "not a model the profile was fitted on")]:
        assert main(["simulate", str(cfg), "--profile", str(prof), "--anchor", model, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1


def _served_log(model, path, steps_s: float, prefill_s: float = 1.0, second: float = 1.0) -> None:
    """A real engine's step log (two greedy requests side by side), its durations then set by hand: every decode step
    `steps_s` (times `second` in the second process), every step with a prefill `prefill_s`; the second half of the
    lines under a second pid (a repeat's server process)."""
    from reference_engine import EngineConfig, LLMEngine, SamplingParams

    eng = LLMEngine(EngineConfig(model=str(model), dtype="float32", num_threads=1, kv_cache_tokens=2048,
                                 step_log=str(path), enable_prefix_caching=False))
    for i in range(2):
        eng.add_request([5 + i + j for j in range(24)], SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.0))
    while eng.has_unfinished():
        eng.step()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for n, x in enumerate(lines):
        prefill = any(kind == "prefill" for _, _, kind in x["scheduled"])
        x["pid"] = 1000 + (n >= len(lines) // 2)
        x["duration_s"] = prefill_s if prefill else steps_s * (second if x["pid"] == 1001 else 1.0)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_served_anchor_reads_the_decode_steps_of_a_step_log_with_the_served_terms(exp_model, tmp_path):
    """Held-out round 8: the anchor reads what served engines of a fit model logged. The served step terms are part of
    the prediction it matches (a served decode step = the in-process one + per_step_s), prefill steps are left out
    (their time is compute, not the memory read the factor scales), and each server process's median is recorded."""
    m = ModelShape.from_dir(exp_model)
    prof = planted(weights=1.0, per_step=0.0, per_seq=0.0)
    prof.fit, prof.fused_max_rows = {"rows_per_model": [[m.signature, 10]]}, 64
    prof.served = {"per_step_s": 0.004}
    read = m.weight_bytes / (prof.bandwidth_gbps * 1e9)  # a step at any rows: the weight read alone
    log = tmp_path / "steps.jsonl"
    _served_log(exp_model, log, steps_s=0.8 * read + 0.004)
    got = anchor.served(prof, [(exp_model, log)], limits=(1e-6, 1e6))
    x = got.anchored
    assert x["factor"] == pytest.approx(0.8, rel=1e-6) and x["how"] == "served step log"
    assert x["per_model"][0]["measured_ms"] == pytest.approx((0.8 * read + 0.004) * 1e3)  # no prefill's 1 s in it
    assert sorted(x["per_model"][0]["per_process_ms"]) == ["1000", "1001"]
    assert x["spread"] == pytest.approx(0.0, abs=1e-9)  # both processes ran alike
    assert x["per_model"][0]["predicted_ms"] == pytest.approx((read + 0.004) * 1e3)
    assert got.served == prof.served and "anchored x0.800" in got.label
    # read as in-process steps, the same log would put the served overhead into the memory read
    steps = [(s, t) for rows in read_log(str(log)).values() for s, t in sweep.shapes(rows) if t < 0.5]
    assert anchor.factor(prof, [(m, steps)], limits=(1e-6, 1e6)) == pytest.approx((0.8 * read + 0.004) / read, rel=1e-6)


def test_a_served_anchor_refuses_a_log_without_decode_steps_and_a_model_not_fitted(exp_model, tmp_path):
    m = ModelShape.from_dir(exp_model)
    prof = planted(weights=1.0)
    prof.fit, prof.fused_max_rows = {"rows_per_model": [[m.signature, 10]]}, 64
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no decode step"):
        anchor.served(prof, [(exp_model, empty)])
    prof.fit = {"rows_per_model": [["another model", 10]]}
    with pytest.raises(ValueError, match="not a model the profile was fitted on"):
        anchor.served(prof, [(exp_model, empty)])


def _weight_read_only(model, tmp_path):
    """A config, the model's shape, a profile fitted on it whose every step is the weight read alone (saved as
    p.json), and that read's seconds."""
    cfg = write_config(tmp_path / "c.toml", model, BODY)
    m = ModelShape.from_dir(model)
    prof = planted(weights=1.0, per_step=0.0, per_seq=0.0)
    prof.fit, prof.fused_max_rows = {"rows_per_model": [[m.signature, 10]]}, 64
    prof.save(tmp_path / "p.json")
    return cfg, m, prof, m.weight_bytes / (prof.bandwidth_gbps * 1e9)


def test_the_cli_anchors_on_a_step_log_and_wants_one_per_model(exp_model, tmp_path, capsys):
    cfg, _, prof, read = _weight_read_only(exp_model, tmp_path)
    _served_log(exp_model, log := tmp_path / "steps.jsonl", steps_s=0.5 * read)
    base = ["simulate", str(cfg), "--profile", str(tmp_path / "p.json"), "--anchor", str(exp_model)]
    assert main([*base, "--anchor-log", str(log), "--anchor-log", str(log), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "one log per model" in err and len(err.splitlines()) == 1
    assert main([*base, "--anchor-log", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main([*base, "--anchor-log", str(log), "--out", str(tmp_path / "out")]) == 0
    assert "served decode step" in (err := capsys.readouterr().err) and "memory terms x0.500" in err
    assert "warning" not in err
    man = json.loads(next((tmp_path / "out").glob("*/*/manifest.json")).read_text())
    assert man["simulated"]["anchored"]["how"] == "served step log"


def test_server_processes_that_disagree_are_called_a_sample(exp_model, tmp_path, capsys):
    """Held-out round 8: one fit model's server processes ran -29 % and +14 % of the calibrated speed. Two processes,
    the second 1.3x slower: the factor pools them, the spread says 30 %, and the CLI warns that the anchor is a sample
    of processes (above anchor.SPREAD), not the machine's speed."""
    cfg, _, prof, read = _weight_read_only(exp_model, tmp_path)
    _served_log(exp_model, log := tmp_path / "steps.jsonl", steps_s=read, second=1.3)
    x = anchor.served(prof, [(exp_model, log)], limits=(1e-6, 1e6)).anchored
    speed = x["per_model"][0]["per_process_speed"]
    assert speed["1000"] == pytest.approx(1.0) and speed["1001"] == pytest.approx(1 / 1.3)
    assert x["spread"] == pytest.approx(0.3) and x["spread"] > anchor.SPREAD
    assert 1.0 <= x["factor"] <= 1.3
    assert main(["simulate", str(cfg), "--profile", str(tmp_path / "p.json"), "--anchor", str(exp_model),
                 "--anchor-log", str(log), "--out", str(tmp_path / "out")]) == 0
    assert "warning: the anchor's server processes ran 30% apart in speed" in capsys.readouterr().err
