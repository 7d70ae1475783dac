"""Throughput per device and the all-reduce share of a decode step, measured beside its estimate
(experiments/measuring/tp_share.py): the arithmetic on known counters."""
from __future__ import annotations

import pytest

from experiments.measuring.tp_share import summary


def test_share_per_device_and_the_ring_estimate():
    eff = {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "data_parallel_size": 2}
    counters = {"tp_decode_steps": 10, "tp_decode_seconds": 0.5, "tp_decode_allreduce_seconds": 0.1,
                "tp_decode_allreduce_bytes": 10 * 8_000_000}
    out = summary({"output_throughput": 400.0}, eff, counters, link_gbps=10.0)
    assert out["devices"] == 4 and out["output_throughput_per_device"] == 100.0
    assert out["decode_step_ms"] == pytest.approx(50.0) and out["allreduce_ms"] == pytest.approx(10.0)
    assert out["allreduce_share"] == pytest.approx(0.2) and out["allreduce_bytes"] == 8_000_000
    # ring: 2 (N-1)/N x 8 MB = 8 MB through each link at 10 GB/s = 0.8 ms of a 50 ms step
    assert out["estimate_ms"] == pytest.approx(0.8) and out["estimate_share"] == pytest.approx(0.016)


def test_nothing_is_made_up():
    assert summary({"output_throughput": 5.0}, {}, {}, 10.0) == {}  # no sizes reported, no counters
    assert "estimate_ms" not in summary({}, {"tensor_parallel_size": 2},
                                        {"tp_decode_steps": 1, "tp_decode_seconds": 1.0}, None)
