"""Step records: what each step scheduled, its KV use and block tables; nothing when off."""
from __future__ import annotations

from reference_engine import LLM, SamplingParams


def test_records_describe_each_step(tiny_llama):
    llm = LLM(str(tiny_llama), record_steps=True, block_size=4, max_num_batched_tokens=8)
    llm.generate([[10] * 10, [11] * 3], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    recs = llm.engine.step_records
    first = recs[0]
    assert first.scheduled == [("0", 8, "prefill")]  # the budget of 8 chunks the 10-token prompt
    assert first.num_prefill_tokens == 8 and first.kv_blocks_used == 2
    assert first.block_tables["0"] and len(first.block_tables["0"]) == 2
    second = recs[1]
    assert ("0", 2, "prefill") in second.scheduled and ("1", 3, "prefill") in second.scheduled
    assert any(r.num_decode_tokens > 0 for r in recs)
    assert recs[-1].finished and recs[-1].kv_blocks_used == 0
    assert all(r.kv_blocks_used + r.kv_blocks_free == llm.engine.stats().kv_total_blocks for r in recs)


def test_records_off_by_default(tiny_llama):
    llm = LLM(str(tiny_llama))
    llm.generate([[10, 11]], SamplingParams(max_tokens=2))
    assert llm.engine.step_records is None
