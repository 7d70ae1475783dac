"""The `[parallel]` block: accepted by the config, handed to every adapter as one option (each maps it
to its own flags: tests/adapters/test_parallel.py), and what an engine cannot do stops `inferlab run`
with one line and exit code 2 before anything starts."""
from __future__ import annotations

import pytest

from adapters.registry import create
from experiments.commands.run import run_main
from experiments.running.runner import build_engine
from experiments.workload.config import ConfigError, load
from tests.experiments.exp_util import write_config


def test_block_reaches_each_adapter_as_its_own_flags(exp_model, tmp_path):
    cfg = load(write_config(tmp_path / "p.toml", exp_model, """
        engines = ["vllm", "reference"]
        [parallel]
        tensor = 2
        """))
    assert cfg.parallel.model_dump() == {"tensor": 2, "pipeline": 1, "data": 1}
    vllm, opts, _ = build_engine(cfg, "vllm", tmp_path / "vllm")
    assert opts["parallel"] == {"tensor": 2, "pipeline": 1, "data": 1}
    assert vllm.args["tensor_parallel_size"] == 2 and "pipeline_parallel_size" not in vllm.args
    ref, _, _ = build_engine(cfg, "reference", tmp_path / "ref")  # in-process: its own process (Isolated)


    child = create("reference", ref.model, ref.dtype, ref.options)  # what experiments/running/isolate.py builds in the child
    assert child.options["tensor_parallel_size"] == 2


def test_bad_block_is_one_line(exp_model, tmp_path):
    with pytest.raises(ConfigError, match=r"parallel.expert: unknown key$"):
        load(write_config(tmp_path / "p.toml", exp_model, 'engine = "vllm"\n[parallel]\nexpert = 2\n'))
    with pytest.raises(ConfigError, match=r"parallel.tensor: Input should be greater than or equal to 1$"):
        load(write_config(tmp_path / "p.toml", exp_model, 'engine = "vllm"\n[parallel]\ntensor = 0\n'))


def test_an_engine_that_cannot_stops_the_run_with_exit_2(exp_model, tmp_path, capsys):
    path = write_config(tmp_path / "p.toml", exp_model, """
        engine = "tgi"
        [parallel]
        pipeline = 2
        [workload]
        num_requests = 2
        input_len = 8
        output_len = 4
        """)
    assert run_main([str(path), "--out", str(tmp_path / "results"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"inferlab: {path}: engine_options.tgi: engine 'tgi': [parallel] pipeline = 2 is not supported "
                   "(TGI shards tensors only (--num-shard); run replicas behind a router for data parallelism)"]
