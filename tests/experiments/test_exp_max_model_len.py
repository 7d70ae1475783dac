"""Issue 27: one max_model_len for every engine of a run, and a pinned KV budget too small for it
rejected before any engine starts (one line, exit code 2)."""
from __future__ import annotations

from experiments.commands.run import run_main
from experiments.workload import context
from experiments.workload.config import Config
from experiments.workload.workloads import WorkItem

ITEMS = [WorkItem("a", [5] * 128, 32), WorkItem("b", [5] * 100, 32)]


def _cfg(tiny, **kw) -> Config:
    return Config.model_validate({"name": "t", "model": str(tiny), "engines": ["reference", "vllm"], **kw})


def test_default_is_the_longest_request_rounded_to_the_largest_block(tiny_llama):
    assert context.choose(_cfg(tiny_llama), ITEMS, 8192) == 256  # 160 -> vLLM's 128-token CPU blocks
    ref = Config.model_validate({"name": "t", "model": str(tiny_llama), "engine": "reference"})
    assert context.choose(ref, ITEMS, 8192) == 160  # 16-token blocks
    assert context.choose(_cfg(tiny_llama), ITEMS, 200) == 200  # capped by the model's context
    assert context.choose(_cfg(tiny_llama, max_model_len=1000), ITEMS, 8192) == 1000  # the config key wins


def test_a_length_the_workload_or_model_cannot_use_is_a_config_error(tiny_llama):
    for cfg, ctx, words in [(_cfg(tiny_llama, max_model_len=100), 8192, "below the workload's longest"),
                            (_cfg(tiny_llama, max_model_len=9000), 8192, "exceeds the model's context"),
                            (_cfg(tiny_llama), 150, "exceeds the model's context")]:
        try:
            context.choose(cfg, ITEMS, ctx)
        except ValueError as e:
            assert words in str(e)
        else:
            raise AssertionError(f"no error for {cfg.max_model_len} / {ctx}")


def test_too_small_kv_budget_exits_2_with_one_line(tiny_llama, tmp_path, capsys):
    """[kv] tokens = 300 holds 256 tokens in reference's 16-token blocks, but vLLM needs 256 + its
    reserved null block of 128 = 384: refused before anything starts, with the numbers and the fix."""
    toml = tmp_path / "small_kv.toml"
    toml.write_text(f'name = "small_kv"\nmodel = "{tiny_llama}"\nengines = ["reference", "vllm"]\n'
                    '[workload]\nkind = "random"\nnum_requests = 2\ninput_len = 128\noutput_len = 32\n'
                    '[load]\nwarmup = 0\n[kv]\ntokens = 300\n')
    assert run_main([str(toml), "--out", str(tmp_path / "results"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "KV budget of 300 tokens" in err and "max_model_len 256" in err and "'vllm'" in err
    assert "set [kv] tokens >= 384" in err and "max_model_len <= 128" in err
    assert not (tmp_path / "results" / "small_kv").exists()  # nothing ran, nothing written
    context.check_kv(Config.model_validate({"name": "t", "model": str(tiny_llama), "engines": ["reference", "vllm"],
                                            "kv": {"tokens": 384}}), 256)  # enough: no error
