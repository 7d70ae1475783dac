"""The step log (step_log.py): one JSON line per step, the same steps `record_steps` keeps in memory."""
from __future__ import annotations

import os

from reference_engine import LLM, SamplingParams
from reference_engine.engine.step_log import read

from tests.reference_engine.helpers import random_prompts


def test_log_holds_the_recorded_steps(tiny_llama, tmp_path):
    path = tmp_path / "steps.jsonl"
    # a KV budget this tight preempts, so the log must carry preemptions and re-admissions too
    llm = LLM(str(tiny_llama), max_num_batched_tokens=16, kv_cache_tokens=640, block_size=8, record_steps=True,
              step_log=str(path))
    prompts = random_prompts(llm.engine.model_config.vocab_size, 16)
    llm.generate(prompts, SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    logged = read(str(path))
    assert list(logged) == [os.getpid()]
    steps, recs = logged[os.getpid()], llm.engine.step_records
    assert len(steps) == len(recs) and any(r.preempted for r in recs)
    for s, r in zip(steps, recs):
        assert s.step == r.step and isinstance(s.duration_s, float)  # a wall time was recorded; its size is no test's business
        for k in ("scheduled", "prefix_hits", "preempted", "finished", "new_tokens", "spec_proposed", "spec_accepted",
                  "shared_kv_tokens"):
            assert getattr(s, k) == getattr(r, k), k
    assert sum(sum(s.new_tokens.values()) for s in steps) == 16 * 64
    # each admission (re-admissions after preemption too) with the core's queueing time, on the monotonic clock
    assert all(set(s.arrived) == set(s.prefix_hits) for s in steps)
    assert len({rid for s in steps for rid in s.arrived}) == 16 and sum(len(s.arrived) for s in steps) > 16
    assert all(a <= s.t0 for s in steps for a in s.arrived.values())
    assert all(a.t0 < b.t0 for a, b in zip(steps, steps[1:]))


def test_a_verify_step_is_logged_as_a_verify_step(tiny_llama, tmp_path):
    """Drafts scheduled after a request's token make a verify row (several rows, the prefill path), never a
    "decode" (one generated token): the engine's records, the step log and the runner share one definition
    (`ScheduledSeq.kind`), and a verify row's tokens are counted apart."""
    path = tmp_path / "steps.jsonl"
    spec = {"method": "draft_model", "model": str(tiny_llama), "num_speculative_tokens": 3}
    llm = LLM(str(tiny_llama), speculative_config=spec, record_steps=True, step_log=str(path))
    llm.generate([[10, 11, 12] * 4], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    recs, [steps] = llm.engine.step_records, read(str(path)).values()
    kinds = [k for r in recs for _, _, k in r.scheduled]
    assert kinds[0] == "prefill" and "verify" in kinds
    for r, s in zip(recs, steps):
        for rid, n, kind in r.scheduled:
            assert (kind == "verify") == (rid in r.spec_proposed)  # drafts verified: exactly the verify rows
            if kind == "verify":
                assert n == r.spec_proposed[rid] + 1 and r.num_verify_tokens >= n and r.num_decode_tokens == 0
        assert s.scheduled == r.scheduled


def test_a_torn_line_is_skipped_and_processes_kept_apart(tmp_path):
    path = tmp_path / "steps.jsonl"
    line = '{"pid":%d,"t":1.0,"step":%d,"duration_s":0.01,"scheduled":[["a",3,"prefill"]],"prefix_hits":{},' \
           '"preempted":[],"finished":[],"new_tokens":{"a":1},"spec_proposed":{},"spec_accepted":{}}\n'
    path.write_text(line % (7, 0) + line % (9, 0) + line % (7, 1) + '{"pid":9,"t":2.0,"st')
    got = read(str(path))
    assert {p: [s.step for s in v] for p, v in got.items()} == {7: [0, 1], 9: [0]}
    assert got[7][0].scheduled == [("a", 3, "prefill")]
    assert got[7][0].shared_kv_tokens == 0  # a line written before the field: nothing shared


def test_sequences_on_one_cached_prefix_log_the_blocks_they_share(tiny_llama, tmp_path):
    """Three requests on one 32-token prefix (4 blocks of 8): the first computes it, the other two find it cached and
    hold the same 4 blocks; while they decode side by side, a step reads those blocks 3 times, so 8 blocks (64 tokens)
    beyond the first read. Requests that share nothing share no block. The step record and the log agree."""
    from reference_engine.worker.step_record import shared

    assert shared([[1, 2, 3], [1, 2, 4], [1, 5]], 8) == 3 * 8 and shared([[1], [2]], 16) == 0
    path = tmp_path / "steps.jsonl"
    llm = LLM(str(tiny_llama), block_size=8, record_steps=True, step_log=str(path))
    head = list(range(10, 42))
    sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm.generate([head + [50, 51]], sp)  # caches the prefix
    llm.generate([head + [60 + i, 70 + i] for i in range(3)], sp)
    recs, [steps] = llm.engine.step_records, read(str(path)).values()
    assert max(r.shared_kv_tokens for r in recs) == 2 * 32
    assert [s.shared_kv_tokens for s in steps] == [r.shared_kv_tokens for r in recs]
    llm.generate(random_prompts(llm.engine.model_config.vocab_size, 3), sp)
    assert all(r.shared_kv_tokens == 0 for r in llm.engine.step_records[len(recs):])
