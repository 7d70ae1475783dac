"""`inferlab serve` flags: every EngineConfig field, vLLM's spellings for caching and speculation."""
from __future__ import annotations

import pytest

from reference_engine.server.cli import engine_config, parse


def test_prefix_caching_and_speculative_config_flags():
    args = parse(["models/tiny", "--no-enable-prefix-caching", "--speculative-config",
                  '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'])
    cfg = engine_config(args)
    assert cfg.model == "models/tiny" and cfg.enable_prefix_caching is False
    assert cfg.speculative_config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    assert cfg.speculative.prompt_lookup_min == 3
    default = engine_config(parse(["models/tiny"]))
    assert default.enable_prefix_caching is True and default.speculative_config is None
    assert engine_config(parse(["m", "--enable-prefix-caching"])).enable_prefix_caching is True
    assert parse(["m"]).served_model_name is None  # the app then serves the model argument as given


def test_bad_speculative_config_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse(["m", "--speculative-config", "{not json"])
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        engine_config(parse(["m", "--speculative-config", '{"method": "ngram"}']))


def test_default_threads_every_core_with_the_engine_process():
    """No --num-threads: every usable core when the core has its own process (the default), one left to the
    front end when it runs in the server's process; a tensor-parallel rank gets its share."""
    import os
    cores = len(os.sched_getaffinity(0))
    assert engine_config(parse(["m"])).num_threads == cores
    assert engine_config(parse(["m", "--no-engine-process"])).num_threads == max(1, cores - 1)
    assert engine_config(parse(["m", "--tensor-parallel-size", "2"])).num_threads == max(1, cores // 2)
    assert engine_config(parse(["m", "--num-threads", "1"])).num_threads == 1


def test_default_dtype_is_vllms_auto(tiny_llama):
    """No --dtype: "auto", vLLM 0.32's rule on CPU: a float32 checkpoint is served in bfloat16, a bf16 or fp16 one in
    its own dtype; a given --dtype wins. The engine reports what it resolved."""
    import torch

    from reference_engine import EngineConfig, LLMEngine
    from reference_engine.config import resolve_dtype

    assert engine_config(parse(["m"])).dtype == "auto"
    assert engine_config(parse(["m", "--dtype", "float32"])).dtype == "float32"
    assert resolve_dtype("auto", "float32") == torch.bfloat16
    assert resolve_dtype("auto", "float16") == torch.float16 and resolve_dtype("auto", "bf16") == torch.bfloat16
    assert resolve_dtype("float32", "bfloat16") == torch.float32 and resolve_dtype("AUTO", "float32") == torch.bfloat16
    with pytest.raises(ValueError, match="unsupported dtype"):
        engine_config(parse(["m", "--dtype", "float8"]))
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="auto", kv_cache_tokens=256))
    assert engine.effective_config()["dtype"] == "bfloat16"
    assert next(engine.runner.model.parameters()).dtype == torch.bfloat16


def test_auto_dtype_is_said_at_start(tiny_llama, capsys):
    from reference_engine.server.cli import say_dtype

    say_dtype(engine_config(parse([str(tiny_llama)])))
    assert capsys.readouterr().err == ("inferlab serve: dtype auto: the float32 checkpoint is served in bfloat16, as "
                                       "vLLM does (--dtype float32 for greedy tokens identical to HF's)\n")
    say_dtype(engine_config(parse([str(tiny_llama), "--dtype", "float32"])))
    assert capsys.readouterr().err == ""
