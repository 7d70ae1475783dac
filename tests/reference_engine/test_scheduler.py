"""Scheduler semantics on synthetic requests (no model): budget, FCFS, caps, preemption order."""
from __future__ import annotations

from reference_engine.config import EngineConfig
from reference_engine.kv_cache_manager import KVCacheManager
from reference_engine.request import Request, Status
from reference_engine.sampling_params import SamplingParams
from reference_engine.scheduler import Scheduler


def _sched(budget=32, blocks=100, block_size=4, max_seqs=8, chunked=True, caching=False):
    cfg = EngineConfig(model="unused", max_num_batched_tokens=budget, max_num_seqs=max_seqs,
                       block_size=block_size, enable_chunked_prefill=chunked)
    return Scheduler(cfg, KVCacheManager(blocks, block_size, enable_prefix_caching=caching))


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
