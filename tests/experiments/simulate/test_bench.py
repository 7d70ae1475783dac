"""`make simulate-bench`'s served runs log their steps (bench.logged) and the report reads them back as a
teacher-forced step check per server process (bench.served_steps)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from experiments.simulate import bench, calibrate, served_overhead, sweep
from experiments.simulate.step_model import ModelShape, predict
from experiments.workload.config import load
from reference_engine import LLM, SamplingParams
from tests.experiments.simulate.planted import planted


def test_measured_config_logs_steps_and_keeps_the_rest(tmp_path):
    for name in ("served.toml", "served_cal.toml"):
        src = bench.HERE / name
        got = load(bench.logged(src, tmp_path))
        want = load(src)
        assert got.repeats == want.repeats == bench.REPEATS
        opts = got.engine_options["reference"]
        assert opts.pop("step_log") == str((tmp_path / "steps" / f"{want.name}.jsonl").absolute())
        assert got.model_dump() == want.model_dump()


def test_served_steps_are_the_logged_steps_against_the_profile(tiny_llama, tmp_path):
    log = tmp_path / "steps.jsonl"
    llm = LLM(str(tiny_llama), max_num_batched_tokens=32, kv_cache_tokens=2048, record_steps=True, step_log=str(log))
    llm.generate([[5 + i] * (3 + 7 * i) for i in range(5)], SamplingParams(max_tokens=9, temperature=0.0,
                                                                         ignore_eos=True))
    shape, prof = ModelShape.from_dir(str(tiny_llama), "float32"), planted()
    res = bench.served_steps(log, prof, shape)
    recorded = sweep.shapes(llm.engine.step_records)
    assert list(res["processes"]) == [str(os.getpid())]
    assert res["all"]["steps"] == len(recorded) == res["decode"]["steps"] + res["mixed"]["steps"]
    # the same shapes as the in-memory records: only the wall times (measured a moment apart) differ
    logged = sweep.shapes(bench.read_log(log)[os.getpid()])
    assert [s for s, _ in logged] == [s for s, _ in recorded]
    assert res["all"] == calibrate.errors(logged, shape, prof)  # a profile without served terms: the same
    assert res["speed"] == res["processes"]
    served_overhead.apply(prof, {"per_step_s": 0.004, "per_seq_s": 0.001}, "test")
    res = bench.served_steps(log, prof, shape)
    want = [(s, d) for s, d in logged]
    e = sorted(abs((predict(s, shape, prof) + 0.004 + 0.001 * len(s.seqs)) / d - 1) for s, d in want)
    assert res["all"]["median_abs"] == pytest.approx(float(np.median(e)))
    assert res["speed"][str(os.getpid())] == calibrate.errors(logged, shape, prof)


def test_the_calibration_threads_are_read_from_the_profiles_notes():
    from experiments.simulate.bench import calibration_threads
    from experiments.simulate.step_model import TERMS, Profile

    prof = Profile("p", 20.0, {"float32": 1.0}, dict.fromkeys(TERMS, 0.0), notes="num_threads=2; a sweep of ...")
    assert calibration_threads(prof) == 2
    prof.notes = "steps timed elsewhere"
    assert calibration_threads(prof) is None
