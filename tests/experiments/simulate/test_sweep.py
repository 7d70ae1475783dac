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


def test_several_models_are_swept_level_by_level_with_the_steps_each_alone_gives(exp_model, monkeypatch):
    """sweep_many runs each closed-loop level on every model before the next (a drift of the machine's speed lands
    on all of them alike), and gives each model the same steps as sweeping it alone."""
    import random

    from experiments.simulate import sweep

    monkeypatch.setattr(sweep, "LEVELS", (1, 3))

    def ragged(seed, vocab):  # a short sweep: 2 + 4 requests
        rng = random.Random(seed)
        return [(c, [rng.randrange(3, vocab) for _ in range(rng.randint(4, 24))], rng.randint(2, 6))
                for c in (1, 1, 3, 3, 3, 3)]

    monkeypatch.setattr(sweep, "ragged", ragged)
    monkeypatch.setattr(sweep, "SHARED_LEVELS", (2,))

    def shared_prefix(seed, vocab):  # 4 requests, 2 at a time, on one 40-token prefix: 2 full blocks they share
        rng = random.Random(seed + 1)
        head = [rng.randrange(3, vocab) for _ in range(40)]
        return [(2, head + [rng.randrange(3, vocab) for _ in range(rng.randint(4, 12))], rng.randint(3, 6))
                for _ in range(4)]

    monkeypatch.setattr(sweep, "shared_prefix", shared_prefix)
    calls, real = [], sweep.closed_loop

    def spy(eng, work, c, *a, **k):
        calls.append((id(eng), c))
        return real(eng, work, c, *a, **k)

    monkeypatch.setattr(sweep, "closed_loop", spy)
    cfg = sweep.engine_config(str(exp_model), "float32", {"num_threads": 1}, kv_cache_tokens=2048, max_model_len=512)
    both = sweep.sweep_many([cfg, cfg], repeats=2)
    engines = list(dict.fromkeys(e for e, _ in calls))
    assert len(engines) == 2
    assert [(engines.index(e), c) for e, c in calls] == [(0, 1), (1, 1), (0, 3), (1, 3), (0, 2), (1, 2)] * 2
    alone, _ = sweep.sweep(cfg, repeats=2)
    for rows, paths in both:
        assert [s for s, _ in rows] == [s for s, _ in alone] and all(t > 0 for _, t in rows)
        assert "fused_decode_max_rows" in paths
        # the shared level's steps read the prefix's 2 blocks twice (round 4: the sweep never had such a step);
        # the ragged levels' prompts share nothing
        assert {s.shared for s, _ in rows} == {0, 32}
        assert all(s.shared == 0 for s, _ in rows if len(s.seqs) == 3)
