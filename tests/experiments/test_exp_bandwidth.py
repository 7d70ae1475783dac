"""The 'how far from the hardware' estimate: its inputs come from the model files, its
arithmetic is the documented formula, and the measured peak is a real number."""
from __future__ import annotations

import pytest
import torch

from experiments.measuring.bandwidth import FORMULA, best_of, decode_estimate, model_shape, peak_copy_gbps


def test_model_shape_reads_weights_and_kv_size_from_the_files(exp_model):
    from reference_engine.config import ModelConfig
    from reference_engine.model.loader import load_model

    shape = model_shape(exp_model, "float32")
    model, cfg = load_model(exp_model, torch.float32, "cpu", 64)
    params = sum(p.numel() for p in model.parameters())  # tied: the embedding is counted once
    assert shape["params"] == params and shape["weight_bytes"] == 4 * params
    assert shape["kv_bytes_per_token"] == ModelConfig.from_dir(exp_model).kv_bytes_per_token(torch.float32)
    assert model_shape(exp_model, "bfloat16")["weight_bytes"] == 2 * params


def test_decode_estimate_is_the_stated_formula():
    shape = {"weight_bytes": 1_000_000_000, "kv_bytes_per_token": 1_000}
    e = decode_estimate(shape, tpot_ms=10.0, running=4, mean_context=500)
    assert e["step_bytes"] == 1_000_000_000 + 4 * 500 * 1_000
    assert e["achieved_gbps"] == pytest.approx(1.002e9 / 0.010 / 1e9)
    assert decode_estimate(shape, tpot_ms=None, running=4, mean_context=500)["achieved_gbps"] is None
    assert "median TPOT" in FORMULA and "KV bytes/token" in FORMULA


def test_peak_copy_is_measured():
    peak = peak_copy_gbps(size_mb=16, repeats=2)
    assert 0.1 < peak["cpu_gbps"] < 10_000 and peak["size_mb"] == 16 and peak["repeats"] == 2
    cores = peak["cpu_threads"]
    assert peak["cpu_gbps"] == max(peak["cpu_gbps_1_thread"], peak[f"cpu_gbps_{cores}_threads"])


def test_best_of_keeps_the_faster_reading_and_every_reading():
    slow = {"cpu_gbps": 20.0, "cpu_gbps_1_thread": 15.0, "gpu_gbps": None}
    fast = {"cpu_gbps": 40.0, "cpu_gbps_1_thread": 30.0, "gpu_gbps": None}
    both = best_of(slow, fast)
    assert both["cpu_gbps"] == 40.0 and both["cpu_gbps_1_thread"] == 30.0 and both["readings"] == [20.0, 40.0]
    third = best_of(both, {"cpu_gbps": 35.0, "gpu_gbps": 900.0})
    assert third["cpu_gbps"] == 40.0 and third["readings"] == [20.0, 40.0, 35.0] and third["gpu_gbps"] == 900.0


def test_split_copy_copies_every_element():
    import numpy as np

    from experiments.measuring.bandwidth import _copy
    src = np.arange(1001, dtype=np.float64)
    for threads in (1, 2, 3):
        dst = np.zeros_like(src)
        _copy(dst, src, threads)
        assert np.array_equal(dst, src)
