"""The simulated replica against the real engine: under a KV budget too small for everyone, the
scheduler's decisions (who runs with how many tokens, who is preempted) are the engine's, step for
step; the step shapes the calibration reads from the engine's records are the simulator's own."""
from __future__ import annotations

import random

from reference_engine import EngineConfig, LLMEngine, SamplingParams

from experiments.simulate.replica import Replica
from experiments.simulate.step_model import ModelShape
from experiments.simulate.sweep import shapes
from tests.experiments.simulate.planted import planted

PROMPTS = (10, 12, 14, 9, 11)
MAX_TOKENS = 14


def cfg(model, **kw) -> EngineConfig:
    return EngineConfig(model=str(model), **{"kv_cache_tokens": 48, "block_size": 4, "max_num_batched_tokens": 32,
                                             "max_num_seqs": 8, **kw})


def prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in PROMPTS]


def test_preemption_under_a_tiny_kv_budget_matches_the_engine_step_for_step(exp_model):
    eng = LLMEngine(cfg(exp_model, record_steps=True))
    ps = prompts(eng.model_config.vocab_size)
    for i, p in enumerate(ps):
        eng.add_request(p, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True), request_id=f"r{i}")
    while eng.has_unfinished():
        eng.step()
    real = [([(rid, n) for rid, n, _ in rec.scheduled], rec.preempted) for rec in eng.step_records]

    rep = Replica(cfg(exp_model), 48 // 4, ModelShape.from_dir(exp_model), planted())
    for i, p in enumerate(ps):
        rep.add(f"r{i}", p, MAX_TOKENS)
    sim, sim_shapes = [], []
    while rep.has_work():
        res = rep.step()
        sim.append((res.scheduled, res.preempted))
        sim_shapes.append(res.shape)

    assert sum(len(p) for _, p in real) >= 2  # the budget really forces preemptions
    assert sim == real
    assert [s for s, _ in shapes(eng.step_records)] == sim_shapes


def test_sequences_on_a_cached_prefix_share_blocks_in_the_simulation_as_in_the_engine(exp_model):
    """Requests on one 12-token prefix (3 blocks of 4), after one that cached it: the simulated replica's steps carry
    the KV blocks its sequences share (StepShape.shared, priced apart by the step model) exactly as the engine's
    records do, step for step."""
    def run_engine(ps):
        eng = LLMEngine(cfg(exp_model, record_steps=True, kv_cache_tokens=512))
        for i, p in enumerate(ps):
            eng.add_request(p, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True), request_id=f"r{i}")
            if i == 0:
                while eng.has_unfinished():
                    eng.step()
        while eng.has_unfinished():
            eng.step()
        return [s for s, _ in shapes(eng.step_records)]

    head = list(range(3, 15))
    ps = [head + p[:2] for p in prompts(ModelShape.from_dir(exp_model).vocab)]
    real = run_engine(ps)
    rep = Replica(cfg(exp_model, kv_cache_tokens=512), 512 // 4, ModelShape.from_dir(exp_model), planted())
    sim = []
    for i, p in enumerate(ps):
        rep.add(f"r{i}", p, MAX_TOKENS)
        if i == 0:
            while rep.has_work():
                sim.append(rep.step().shape)
    while rep.has_work():
        sim.append(rep.step().shape)
    assert sim == real
    assert max(s.shared for s in sim) == 3 * 3 * 4  # 4 sequences on the prefix's 3 blocks: 3 reads beyond the first


def test_speculation_emits_accepted_drafts(exp_model):
    """k = 3 drafts: all accepted, 9 tokens take a prefill step then two steps of 4; none accepted, 9 steps."""
    for accept, steps in ((1.0, 3), (0.0, 9)):
        rep = Replica(EngineConfig(model=str(exp_model), kv_cache_tokens=256), 16, ModelShape.from_dir(exp_model),
                      planted(), spec_k=3, accept=accept)
        rep.add("a", list(range(3, 20)), 9)
        n = 0
        while rep.has_work():
            rep.step()
            n += 1
        assert n == steps


def test_the_acceptance_counter_reads_the_accept_knob(exp_model):
    """--accept is the rate the engine's counters report (accepted / draft tokens): the simulated counter
    matches it within sampling error (3 sigma over the verified drafts), for k = 1, 3 and 5. Taken as a
    per-token probability in order, 0.7 read about 0.51 at k = 3 (0.44-0.47 with the tail of a request)."""
    from experiments.simulate.replica import position_probability

    assert abs(sum(position_probability(0.7, 3) ** i for i in (1, 2, 3)) / 3 - 0.7) < 1e-9
    for k in (1, 3, 5):
        rep = Replica(EngineConfig(model=str(exp_model), kv_cache_tokens=4096), 256, ModelShape.from_dir(exp_model),
                      planted(), spec_k=k, accept=0.7, seed=k)
        for i in range(40):
            rep.add(f"r{i}", list(range(3 + i, 13 + i)), 60)
        while rep.has_work():
            rep.step()
        _, drafted, accepted = rep.spec
        rate, sigma = accepted / drafted, (0.7 * 0.3 / drafted) ** 0.5 * k  # runs of k are correlated: k x wider
        assert abs(rate - 0.7) < 3 * sigma, (k, rate, drafted)
