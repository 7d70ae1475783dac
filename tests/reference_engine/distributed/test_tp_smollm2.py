"""The real model over 2 ranks: SmolLM2-135M-Instruct (9 heads in 3 KV groups: an uneven 6 + 3 split) gives
the same fp32 greedy chat answers, EOS on, as one rank, with prefix caching and n-gram speculation on."""
from __future__ import annotations

import pytest

from reference_engine import LLM, SamplingParams

pytestmark = pytest.mark.slow

CHATS = ["What is the capital of France?", "Name three primary colors.", "What is 12 plus 30?"]
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def test_smollm2_two_ranks_answer_as_one(smollm2):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    ids = [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                        tokenize=True)["input_ids"]) for q in CHATS]
    greedy = SamplingParams(max_tokens=20, temperature=0.0)  # EOS stops a request
    out = {}
    for tp in (1, 2):
        llm = LLM(str(smollm2), tensor_parallel_size=tp, kv_cache_tokens=1024, speculative_config=SPEC)
        try:
            out[tp] = [o.token_ids for batch in (ids[:1], ids) for o in llm.generate(batch, greedy)]
            s, mem = llm.engine.stats(), llm.engine.memory_report()
        finally:
            llm.engine.close()
    assert out[2] == out[1]
    assert any(t[-1] == 2 and len(t) < 20 for t in out[2])  # some answer ended at <|im_end|>
    assert s.prefix_cache_hits > 0 and s.spec_decode_num_draft_tokens > 0
    assert mem["weights_rank0"] > mem["weights_rank1"]  # rank 0 holds 2 of the 3 KV groups
