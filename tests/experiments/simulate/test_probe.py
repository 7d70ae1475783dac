"""The speed probe and the drift control of a held-out round (probe.py): the GEMM pass covers the model's weights
in the order a decode step reads them, the control times the engine's own one-row steps against the profile, and
the round's record divides the control's error out of the held-out model's."""
from __future__ import annotations

import math

import pytest

from experiments.simulate import probe, validate
from experiments.simulate.step_model import ModelShape

from tests.experiments.simulate.planted import PER_SEQ, PER_STEP, planted


def test_the_pass_reads_the_models_weights_in_call_order():
    m = ModelShape(layers=3, hidden=512, heads=8, kv_heads=4, head_dim=64, intermediate=1344, vocab=32768)
    mats = probe.matrices(m)
    assert len(mats) == 4 * 3 + 1 and mats[-1] == (32768, 512)
    assert mats[:4] == [((8 + 8) * 64, 512), (512, 512), (2 * 1344, 512), (512, 1344)]
    assert 4 * sum(n * k for n, k in mats) == m.weight_bytes


def test_the_gemm_pass_runs_the_engines_kernel():
    m = ModelShape(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, vocab=1000)
    t = probe.gemm_pass(m, threads=1, repeats=3)
    assert 0 < t < math.inf
    with pytest.raises(ValueError, match="no panel GEMM"):
        probe.gemm_pass(ModelShape(2, 256, 4, 2, 64, 512, 1000, dtype="float16"), 1)


def test_the_control_times_one_row_steps_against_the_profile(exp_model):
    prof = planted()  # every one-row step predicted PER_STEP + PER_SEQ
    got = probe.one_row(exp_model, prof, threads=1, tokens=16, skip=4)
    assert got["steps"] == 2 * (16 - 1 - 4)  # each answer's decode steps after the first `skip`
    assert got["predicted_ms"] == pytest.approx((PER_STEP + PER_SEQ) * 1e3)
    assert got["measured_ms"] > 0
    assert got["error"] == pytest.approx(got["predicted_ms"] / got["measured_ms"] - 1)


def test_the_control_runs_at_the_contexts_it_is_given(exp_model):
    """Round 4's control at 64-token prompts read the profile's short-context error, not the machine: round 5 takes
    it at the sweep's contexts. With a KV term in the profile, a longer prompt predicts a longer step."""
    from experiments.simulate.step_model import ModelShape

    prof = planted(kv=1.0)
    short, long = (probe.one_row(exp_model, prof, threads=1, tokens=12, skip=2, prompt=n) for n in (16, 200))
    per_token = ModelShape.from_dir(exp_model).kv_bytes_per_token / 100e9  # planted: 100 GB/s
    assert long["predicted_ms"] - short["predicted_ms"] == pytest.approx(184 * per_token * 1e3)


def test_the_record_divides_the_controls_drift_out():
    res = {"teacher_forced": {"1 streams: decode": {"steps": 100, "median_abs": 0.2, "p90_abs": 0.3,
                                                    "median_signed": 0.21},
                              "control": [{"utc": "01:00:00", "model": "deep", "measured_ms": 50.0,
                                           "predicted_ms": 55.0, "error": 0.10},
                                          {"utc": "01:05:00", "model": "deep", "measured_ms": 50.0,
                                           "predicted_ms": 55.0, "error": 0.10}]},
           "load": {"trace": {"start": {"utc": "01:00:00", "gemm_pass_ms": 52.0},
                              "end": {"utc": "01:05:00", "gemm_pass_ms": 47.0}}}}
    md = validate.markdown(res)
    assert "= +10.0% (transfer, with the drift divided out)" in md  # 1.21 / 1.10 - 1
    assert "| trace | 01:00:00 | 52.0 | 01:05:00 | 47.0 |" in md
    assert md.count("Drift control at") == 2
