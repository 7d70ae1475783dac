"""Scheduler semantics on synthetic requests (no model): budget, FCFS, caps, preemption order."""
from __future__ import annotations

from reference_engine.config import EngineConfig
from reference_engine.core.request import Request, Status
from reference_engine.sampling_params import SamplingParams
from reference_engine.core.scheduler import Scheduler


def _sched(budget=32, blocks=100, block_size=4, max_seqs=8, chunked=True, caching=False):
    cfg = EngineConfig(model="unused", max_num_batched_tokens=budget, max_num_seqs=max_seqs,
                       block_size=block_size, enable_chunked_prefill=chunked, enable_prefix_caching=caching)
    return Scheduler(cfg, blocks)  # the scheduler builds its own KV-cache manager


def _req(rid, n):
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=8))


def _advance(sched, out):
    """Pretend the step ran: KV computed, a token sampled where the prompt finished."""
    for r, n in out.scheduled:
        r.num_computed_tokens += n
        if r.num_computed_tokens == r.num_tokens:
            r.output_token_ids.append(7)


def test_budget_is_shared_and_prompts_are_chunked():
    s = _sched(budget=32)
    a, b = _req("a", 20), _req("b", 30)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert [(r.request_id, n) for r, n in out.scheduled] == [("a", 20), ("b", 12)]
    _advance(s, out)
    out = s.schedule()  # a decodes (1), b continues its prompt (18)
    assert [(r.request_id, n) for r, n in out.scheduled] == [("a", 1), ("b", 18)]
    assert all(len(r.block_table) * 4 >= r.num_computed_tokens + n for r, n in out.scheduled)


def test_no_chunking_waits_for_room():
    s = _sched(budget=32, chunked=False)
    s.add(_req("a", 20))
    s.add(_req("b", 30))
    out = s.schedule()
    assert [r.request_id for r, _ in out.scheduled] == ["a"]


def test_max_num_seqs_caps_running():
    s = _sched(max_seqs=2)
    for i in range(4):
        s.add(_req(str(i), 3))
    out = s.schedule()
    assert len(out.scheduled) == 2 and len(s.waiting) == 2


def test_preempts_most_recent_and_readmits_first():
    s = _sched(budget=64, blocks=6, block_size=4)  # 24 tokens of KV
    a, b, c = _req("a", 8), _req("b", 8), _req("c", 7)
    for r in (a, b, c):
        s.add(r)
    out = s.schedule()
    assert [r.request_id for r, _ in out.scheduled] == ["a", "b", "c"]  # 2 + 2 + 2 blocks
    _advance(s, out)
    out = s.schedule()  # a and b need a 3rd block each: c (newest) is preempted
    assert [r.request_id for r in out.preempted] == ["c"]
    assert c.status is Status.PREEMPTED and c.num_computed_tokens == 0 and c.block_table == []
    assert list(s.waiting)[0] is c
    assert s.kv.num_free + s.kv.num_used == s.kv.num_blocks
    s.finish(a)
    s.finish(b)
    assert s.kv.num_used == 0
    _advance(s, out)
    out = s.schedule()
    assert [(r.request_id, n) for r, n in out.scheduled] == [("c", 8)]  # recompute prompt + 1 output


def test_scheduler_owns_the_kv_manager_and_hands_the_runner_a_plain_record():
    """The step record carries what the runner needs (query tokens, first position, block table,
    whether it samples); the counters come from `stats()`, not from a pool held elsewhere."""
    s = _sched(budget=6, blocks=10, block_size=4)
    s.add(_req("a", 10))
    out = s.schedule()
    (seq,) = out.seqs
    assert (seq.token_ids, seq.start, seq.samples, seq.drafts) == ([1, 2, 3, 4, 5, 6], 0, False, [])
    assert seq.block_table == s.running[0].block_table and len(seq.block_table) == 2
    st = s.stats()
    assert (st.kv_used_blocks, st.kv_free_blocks, st.kv_total_blocks, st.kv_peak_blocks) == (2, 8, 10, 2)
    _advance(s, out)
    (seq,) = s.schedule().seqs  # the rest of the prompt: it reaches the end, so it samples
    assert (seq.token_ids, seq.start, seq.samples) == ([7, 8, 9, 10], 6, True)
