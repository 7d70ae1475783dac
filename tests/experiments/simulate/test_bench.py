"""`make simulate-bench`'s served runs log their steps (bench.logged) and the report reads them back as a
teacher-forced step check per server process (bench.served_steps)."""
from __future__ import annotations

import os

from experiments.config import load
from experiments.simulate import bench, calibrate, sweep
from experiments.simulate.step_model import ModelShape
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
    assert res["all"] == calibrate.errors(logged, shape, prof)
