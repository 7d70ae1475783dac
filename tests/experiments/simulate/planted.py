"""A planted step-time model for the simulator's mechanism tests: every step costs PER_STEP plus
PER_SEQ per scheduled sequence, nothing else, so predicted times are hand-computable."""
from __future__ import annotations

from experiments.simulate.step_model import TERMS, Profile

PER_STEP, PER_SEQ = 0.010, 0.001


def planted(**coef: float) -> Profile:
    c = {k: 0.0 for k in TERMS}
    c.update(per_step=PER_STEP, per_seq=PER_SEQ)
    c.update(coef)
    return Profile("planted", 100.0, {"float32": 1.0}, c, calibrated=True, machine="test")
