"""What the simulator is told in advance (sweep.py): each answer's length, from the engine offline. The
served runs it predicts are greedy, and greedy fp32 answers do not depend on the batch, so the lengths
given must be exactly the answers the engine gives to those prompts."""
from __future__ import annotations

from experiments.simulate import sweep
from experiments.workload import workloads
from experiments.workload.config import load
from reference_engine import LLM, SamplingParams
from tests.experiments.exp_util import write_config

BODY = """
engine = "reference"
dtype = "float32"
[workload]
kind = "chat"
num_requests = 6
output_len = 48
seed = 0
[sampling]
temperature = 0.0
ignore_eos = false
"""


def test_eos_lengths_are_the_greedy_answers_lengths(smollm2, tmp_path):
    """Offline, all six queued at once (one batch), against each prompt generated alone, greedy: the same
    lengths, and some answers end at EOS before max_tokens (so the check sees the sampling: at the default
    temperature of 1 the lengths would be draws)."""
    cfg = load(write_config(tmp_path / "c.toml", smollm2, BODY))
    items, _ = workloads.build(cfg.model, cfg.workload, 0)
    ecfg = sweep.engine_config(cfg.model, cfg.dtype, {}, kv_cache_tokens=8192, max_model_len=2048)
    got = sweep.eos_lengths(ecfg, items, cfg.sampling.ignore_eos, cfg.sampling.temperature)
    llm = LLM(str(smollm2), kv_cache_tokens=8192, max_model_len=2048)
    want = {it.request_id: len(llm.generate([it.prompt_token_ids], SamplingParams(
        max_tokens=it.output_len, temperature=0.0, ignore_eos=False))[0].token_ids) for it in items}
    assert got == want
    assert any(n < it.output_len for n, it in zip(want.values(), items))
