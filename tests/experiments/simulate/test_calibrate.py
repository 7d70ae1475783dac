"""The calibration fit recovers planted coefficients from step times the planted model produced."""
from __future__ import annotations

import random

import pytest

from experiments.simulate.calibrate import errors, fit
from experiments.simulate.step_model import ModelShape, Profile, StepShape, features, predict

SHAPE = ModelShape(layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512, vocab=1000)
TRUE = {"weights": 1.4, "kv": 2.0, "linear": 1.8, "attention": 3.0, "per_seq": 2e-4, "per_step": 0.0}


def steps(n: int = 60) -> list[StepShape]:
    rng = random.Random(1)
    out = []
    for _ in range(n):
        b = rng.choice([1, 2, 4, 8, 16])
        seqs = []
        for _ in range(b):
            new = rng.choice([1, 1, 1, 16, 128, 512])
            seqs.append((new, new + rng.randrange(0, 2000), 1))
        out.append(StepShape(tuple(seqs)))
    return out


def test_fit_recovers_planted_coefficients():
    prof = Profile("p", bandwidth_gbps=20.0, tflops={"float32": 0.5}, coef=TRUE)
    rows = [(s, predict(s, SHAPE, prof)) for s in steps()]
    got = fit(rows, SHAPE, Profile("p", 20.0, {"float32": 0.5}, dict.fromkeys(TRUE, 0.0)))
    assert got == pytest.approx(TRUE, rel=1e-6, abs=1e-12)
    assert errors(rows, SHAPE, prof)["p90_abs"] == pytest.approx(0.0, abs=1e-12)


def test_a_term_that_would_need_a_negative_weight_is_dropped():
    """Step times that fall with context (no physical term does): the kv coefficient is held at 0."""
    prof = Profile("p", 20.0, {"float32": 0.5}, dict.fromkeys(TRUE, 0.0))
    rows = [(s, 0.05 - 1e-6 * sum(c for _, c, _ in s.seqs) + 1e-3 * len(s.seqs)) for s in steps()]
    got = fit(rows, SHAPE, prof)
    assert got["kv"] == 0.0 and all(v >= 0 for v in got.values())


def test_roofline_terms_by_hand():
    """One decode of one sequence at context 100 on a 1 GB/s, 1 TFLOPS device."""
    prof = Profile("p", 1.0, {"float32": 1.0}, dict.fromkeys(TRUE, 0.0))
    f = features(StepShape(((1, 100, 1),)), SHAPE, prof)
    assert f["weights"] == SHAPE.weight_bytes / 1e9
    assert f["kv"] == 100 * 2 * 4 * 2 * 64 * 4 / 1e9
    assert f["linear"] == 2 * (SHAPE.layer_params + 1000 * 256) / 1e12
    assert f["attention"] == 4 * 4 * 4 * 64 * 100 / 1e12
