"""The held-out rounds keep their protocol (experiments/simulate/heldout/README.md): the test suite differs from
the fit suite in model, workload shape, step budget and seeds; the fit's sizes span 10x with the largest past a
last-level cache; a round after the first fits models of two widths (the per-layer cost) and tests a model no
earlier round has seen; the Poisson levels are the search config at fixed rates under their own name."""
from __future__ import annotations

import re

import pytest

from experiments.simulate import bench, validate
from experiments.workload.config import load
from reference_engine.model.make import build_config, param_count

L3 = 480 * 2**20  # the largest last-level cache of the machines these rounds run on


def _bytes(preset: str) -> int:
    return 4 * param_count(build_config(preset))  # fp32


@pytest.mark.parametrize("rnd", sorted(validate.ALSO))
def test_a_rounds_suites_keep_the_protocol(rnd):
    s = {k: load(v) for k, v in validate.suite(rnd).items()}
    fit = [s["calibrate"].make_model.preset] + [preset for _, preset, _ in validate.ALSO[rnd]]
    sizes = sorted(_bytes(p) for p in fit)
    assert sizes[-1] >= 10 * sizes[0] and sizes[-1] > 2 * L3
    test_models = {s["closed"].make_model.preset, s["search"].make_model.preset}
    assert len(test_models) == 1 and not test_models & set(fit + [s["served_cal"].make_model.preset])
    assert s["closed"].model == s["search"].model != s["calibrate"].model
    for t in (s["closed"], s["search"]):
        assert t.sampling.ignore_eos  # answer lengths a user has before the run (rule 2)
        assert t.workload.kind != s["served_cal"].workload.kind
        assert t.workload.seed not in {s["calibrate"].workload.seed, s["served_cal"].workload.seed}
        assert t.workload.prefix_len + t.workload.input_len > s["served_cal"].workload.input_len  # longer prompts
        budget = t.engine_options["reference"].get("max_num_batched_tokens")
        assert budget and budget != s["served_cal"].engine_options["reference"].get("max_num_batched_tokens")
        assert validate.name(validate.suite(rnd)["closed"]) == t.name or t.load.mode == "search"
    if rnd > 1:  # a fresh test suite: a model no earlier round fitted or tested, and fit models of two widths
        from experiments.simulate.calibrate import identifiable
        from experiments.simulate.step_model import ModelShape

        seen = set()
        for r in range(1, rnd):
            e = {k: load(v) for k, v in validate.suite(r).items()}
            seen |= {c.make_model.preset for c in e.values()} | {preset for _, preset, _ in validate.ALSO[r]}
        assert not test_models & seen
        shapes = [ModelShape(c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"],
                             c["num_key_value_heads"], c["head_dim"], c["intermediate_size"], c["vocab_size"])
                  for c in map(build_config, fit)]
        assert identifiable(shapes) == 3
        if rnd > 3:  # round 4: tiny reads from the cache, so three models past it (rank 3 without tiny)
            from experiments.simulate.calibrate import RESIDENT

            assert identifiable(shapes, L3 * RESIDENT) == 3


def test_round_4s_poisson_levels_take_64_requests_at_least(tmp_path):
    src = validate.suite(4)["search"]
    path = bench.poisson_config(src, [0.3, 0.6], tmp_path, name="heldout4_test_poisson",
                                min_requests=validate.POISSON_REQUESTS[4])
    assert load(path).workload.num_requests == 64 > load(bench.poisson_config(src, [0.3, 0.6], tmp_path)).workload.num_requests


def test_poisson_levels_are_the_search_config_at_fixed_rates(tmp_path):
    src = validate.suite(1)["search"]
    path = bench.poisson_config(src, [0.2, 0.5], tmp_path, name="heldout1_test_poisson")
    got, want = load(path), load(src)
    assert path.name == "heldout1_test_poisson.toml" and got.name == "heldout1_test_poisson"
    assert got.load.mode == "open" and got.load.rate == [0.2, 0.5] and got.repeats == bench.REPEATS
    assert got.workload.model_dump(exclude={"num_requests"}) == want.workload.model_dump(exclude={"num_requests"})
    assert got.workload.num_requests == max(want.workload.num_requests, 15)  # 0.5 req/s for a 30 s level
    assert len(re.findall(r"(?m)^name = ", path.read_text())) == 1


def test_the_two_model_fit_takes_the_sweeps_first_two_models_only(tmp_path):
    """Round 3's "fitted on A and B" variant: refit on the calibration's first two models' rows (rows_per_model), then
    the held-out trace's decode steps against it. Planted: a third fitted model whose steps are off by 3x would pull
    any fit that read its rows."""
    import json

    from experiments.simulate import sweep
    from experiments.simulate.calibrate import calibrate
    from experiments.simulate.step_model import TERMS, ModelShape, Profile, predict

    from tests.experiments.simulate.test_calibrate import decode_steps

    def model(name, layers, hidden):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "hidden_size": hidden,
                                                    "num_attention_heads": hidden // 64, "num_key_value_heads": 2,
                                                    "intermediate_size": 3 * hidden, "vocab_size": 4096}))
        return str(d)

    dirs = [model("a", 4, 256), model("b", 40, 768), model("c", 16, 1024)]
    held = ModelShape.from_dir(model("held", 10, 1536))
    shapes = [ModelShape.from_dir(d) for d in dirs]
    truth = Profile("t", 20.0, {"float32": 1.0}, dict.fromkeys(TERMS, 0.0), fused_max_rows=64, regimes={
        "decode": {**dict.fromkeys(TERMS, 0.0), "per_step": 1e-3, "weights": 1.2, "kv": 1.5}})
    dec = decode_steps(30)
    rows = [(s, predict(s, m, truth) * (3.0 if m is shapes[2] else 1.0)) for m in shapes for s in dec]
    prof = calibrate(rows, [m for m in shapes for _ in dec], 20.0, 1.0, "test", fused_max_rows=64)
    assert prof.fit["rows_per_model"] == [[m.signature, len(dec)] for m in shapes]
    sweep.dump(rows, tmp_path / "profile.steps.json")
    for c in (1, 4, 8):
        sweep.dump([(s, predict(s, held, truth)) for s in dec], tmp_path / f"trace-c{c}.steps.json")
    got = validate.two_models(prof, tmp_path, held, dirs)
    assert got["fitted_on"] == [shapes[0].signature, shapes[1].signature]
    assert all(abs(got[f"{c} streams: decode"]["median_signed"]) < 0.01 for c in (1, 4, 8))


def test_round_5s_trace_reaches_the_batch_of_round_4s_load_levels():
    """Round 4's 60 / 85 % levels ran 17-31 requests in flight, where its decode steps missed, and its trace stopped
    at 8 streams; round 5's reaches 24, on prompts enough for twice that many, and its control runs at the sweep's
    contexts."""
    streams, cfg = validate.TRACE_STREAMS[5], load(validate.suite(5)["closed"])
    assert max(streams) >= 16 and cfg.workload.num_requests >= 2 * max(streams)
    assert validate.CONTROL_PROMPT[5] >= 512


def test_an_anchored_round_reports_both_profiles_and_the_machines_path():
    """Round 6 on (validate.ANCHOR): the record gives the anchors, the trace against the profile as calibrated beside
    the anchored one, the un-anchored capacity, and the control at every timed phase."""
    assert 6 in validate.ANCHOR and 5 not in validate.ANCHOR  # round 5 ran without: its record stays as measured
    row = {"measured": 100.0, "predicted": 110.0, "error": 0.10, "interval": [0.05, 0.15], "resolvable": True}
    lv = {"rate=1": {"ttft_p50": row, "tpot_p50": row, "throughput": {**row, "interval": None}}}
    res = {"teacher_forced": {"1 streams: decode": {"steps": 50, "median_abs": 0.02, "p90_abs": 0.05, "median_signed": 0.02},
                              "unanchored": {"1 streams: decode": {"steps": 50, "median_abs": 0.13, "p90_abs": 0.2,
                                                                   "median_signed": 0.13}}},
           "anchors": {"predict": {"utc": "01:00:00", "model": "models/heldout-mid", "measured_ms": 50.0,
                                   "predicted_ms": 56.5, "factor": 0.87}},
           "load": {"closed": {"start": {"utc": "01:01:00", "gemm_pass_ms": 55.0, "control_ms": 50.1,
                                         "control_error": 0.128},
                               "end": {"utc": "01:05:00", "gemm_pass_ms": 54.0, "control_ms": 49.0,
                                       "control_error": 0.153}}},
           "heldout6_test_poisson": lv, "heldout6_test_poisson (un-anchored)": lv,
           "capacity": {"measured": 2.0, "predicted": 1.9, "error": -0.05},
           "capacity_unanchored": {"measured": 2.0, "predicted": 1.6, "error": -0.2}}
    md = validate.markdown(res)
    assert "| 1 streams: decode | 50 | 2.0% |" in md and "(not anchored), the same decode steps: 1 streams +13.0%" in md
    assert "Anchored for predict at 01:00:00 on models/heldout-mid" in md and "memory terms x0.870" in md
    assert "| closed | 50.1 (+12.8%) | 49.0 (+15.3%) |" in md
    res["teacher_forced"]["control"] = [{"utc": "01:00:00", "model": "mid", "measured_ms": 50.0, "predicted_ms": 55.0,
                                         "error": 0.10}]
    md = validate.markdown(res)  # the control is against the profile as calibrated: it divides the un-anchored error
    assert "error as calibrated against the control's: (1 +13.0%) / (1 +10.0%) - 1 = +2.7%" in md
    assert "**heldout6_test_poisson (un-anchored)**" in md
    res["anchors"]["poisson"] = {"utc": "02:00:00", "model": "mid + deep", "how": "served step log", "factor": 0.95,
                                 "spread": 0.031,
                                 "per_model": [{"model": "mid", "measured_ms": 33.0, "predicted_ms": 34.0,
                                                "per_process_ms": {"11": 32.5, "12": 33.5}}]}
    md = validate.markdown(res)  # round 8 on: the servers' decode steps, each process's median beside the pooled one
    assert ("Anchored for poisson at 02:00:00 on mid + deep: served decode steps (median) 33.00 ms measured, 34.00 ms "
            "as calibrated (per process 32.50 / 33.50 ms): memory terms x0.950; its server processes 3% apart in speed.") in md
    assert "Capacity (SLO search): measured 2.0 req/s, predicted 1.9 req/s, error -5.0% (bar 15 %: met)" in md
    assert "Capacity (SLO search, un-anchored): measured 2.0 req/s, predicted 1.6 req/s, error -20.0% (bar 15 %: MISSED)" in md


def test_the_record_gives_each_server_processs_p50_beside_the_pooled_one():
    """Round 9 on: round 8's two closed-loop processes ran TTFT p50 506 and 846 ms on the same requests, and the pooled
    p50 (676 ms) sat between them; the record prints each process's p50s under the pooled row."""
    row = {"measured": 676.0, "predicted": 487.0, "error": -0.28, "interval": [-0.43, -0.03], "resolvable": False}
    per = {"1": {"ttft_p50": 506.5, "tpot_p50": 47.1}, "2": {"ttft_p50": 846.4, "tpot_p50": 43.0}}
    lv = {"concurrency=2": {"ttft_p50": row, "tpot_p50": row, "throughput": {**row, "interval": None},
                            "per_process": per}}
    md = validate.markdown({"heldout9_test_closed": lv})
    assert ("| concurrency=2 | measured p50 per server process | TTFT 506.5 / TPOT 47.1 ms; TTFT 846.4 / TPOT 43.0 ms |"
            in md)
    lv["concurrency=2"]["per_process"] = {"1": per["1"]}  # one process: the pooled row is its own
    assert "per server process" not in validate.markdown({"heldout9_test_closed": lv})


def test_the_unanchored_trace_is_the_same_steps_against_the_calibrated_profile(tmp_path):
    from experiments.simulate import anchor, sweep
    from experiments.simulate.step_model import ModelShape, StepShape, predict
    from tests.experiments.simulate.planted import planted

    m = ModelShape(layers=16, hidden=1280, heads=10, kv_heads=2, head_dim=128, intermediate=3584, vocab=40960)
    prof = planted(weights=1.0, kv=1.0)
    prof.fused_max_rows = 64  # one-row steps take the decode path
    steps = [StepShape(((1, c, 1),)) for c in range(600, 700, 5)]
    sweep.dump([(s, predict(s, m, anchor.scaled(prof, 0.9))) for s in steps], tmp_path / "trace-c1.steps.json")
    got = validate.unanchored(prof, tmp_path, m, (1,))["1 streams: decode"]
    assert got["steps"] == len(steps) and 0.05 < got["median_signed"] < 0.12  # slower as calibrated: the drift


def test_a_served_anchor_runs_fit_models_only():
    """Round 8 on (validate.ANCHOR_SERVED): the anchor's served runs are fit-suite configs of the round's fit models
    past the cache (anchor.check refuses any other), logged across two server processes at least."""
    for rnd in validate.ANCHOR_SERVED:
        assert rnd in validate.ANCHOR
        cfgs = sorted((validate.HELDOUT / f"round{rnd}" / "fit").glob("anchor_*.toml"))
        fit = {path for path, _, _ in validate.ALSO[rnd]}
        assert len(cfgs) >= 2
        for c in map(load, cfgs):
            assert c.model in fit and c.repeats >= 2 and c.load.mode == "closed"
            assert c.make_model.preset in {p for _, p, _ in validate.ALSO[rnd]}
            assert _bytes(c.make_model.preset) > L3 / 2  # past the cache on every machine these rounds ran on
