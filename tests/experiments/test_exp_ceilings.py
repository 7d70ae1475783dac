"""The compute ceiling: the model's own projection shapes, measured in a child process, and
the two fractions a level is reported against."""
from __future__ import annotations

import json

import pytest

from experiments.measuring import ceilings


def test_shapes_and_params_from_the_config(exp_model):
    cfg = json.loads((exp_model / "config.json").read_text())
    h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    assert ceilings.linear_shapes(cfg) == [(h, q + 2 * kv), (q, h), (h, 2 * i), (i, h)]
    assert ceilings.non_embedding_params(exp_model) == layers * (h * (q + 2 * kv) + q * h + 3 * h * i)


def test_compute_peak_is_measured_in_a_child(exp_model):
    c = ceilings.compute_peak(str(exp_model), "float32")
    assert c["gflops"] > 0.1 and c["device"] == "cpu" and c["dtype"] == "float32"
    assert c["shapes"][0][0] == ceilings.TOKENS
    # every GEMM library engines use on a CPU is timed, and the best one is the ceiling
    assert set(c["by_library"]) == {"matmul", "onednn"} and c["gflops"] == max(c["by_library"].values())
    assert c["library"] in c["by_library"]
    assert "error" in ceilings.compute_peak(str(exp_model / "missing"), "float32")


def test_fractions():
    s = {"ttft_ms": {"median": 100.0}, "num_requests": 4, "prompt_tokens": 400,
         "bandwidth": {"achieved_gbps": 5.0}}
    f = ceilings.fractions(s, 1_000_000, {"gflops": 10.0, "device": "cpu"}, {"cpu_gbps": 20.0})
    assert f["prefill_gflops"] == pytest.approx(2 * 1e6 * 100 / 0.1 / 1e9)  # 2 GFLOP/s
    assert f["prefill_of_ceiling"] == pytest.approx(0.2) and f["decode_of_ceiling"] == pytest.approx(0.25)
    s["bandwidth"] = {"step_bytes": 500e6, "tpot_ms": 50.0, "achieved_gbps": 10.0}
    f = ceilings.fractions(s, 1_000_000, {"gflops": 10.0, "device": "cpu"}, {"cpu_gbps": 20.0})
    assert f["floor_ms"] == pytest.approx(25.0) and f["tpot_over_floor"] == pytest.approx(2.0)  # 500 MB at 20 GB/s
    assert ceilings.fractions({}, None, {}, {}) == {}
