"""Workloads are token-exact and seeded: same config -> same prompt ids; no special tokens
in random prompts; shared prefixes shared; later turns extend earlier ones."""
from __future__ import annotations

from pathlib import Path

import pytest

from experiments.workload.config import Workload
from experiments.workload.workloads import build, load_tokenizer, normal_ids

SHAREGPT = Path(__file__).resolve().parents[2] / "experiments" / "data" / "sharegpt_sample.json"


def special_ids(model) -> set[int]:
    return {i for i, t in load_tokenizer(model).get_added_tokens_decoder().items() if t.special}


def test_random_is_deterministic_and_avoids_special_tokens(exp_model):
    w = Workload(num_requests=20, input_len=[5, 40], output_len=[3, 9], seed=7)
    a, warm_a = build(exp_model, w, 3)
    b, warm_b = build(exp_model, w, 3)
    assert [(i.request_id, i.prompt_token_ids, i.output_len) for i in a] == \
        [(i.request_id, i.prompt_token_ids, i.output_len) for i in b]
    assert [i.prompt_token_ids for i in warm_a] == [i.prompt_token_ids for i in warm_b]
    c, _ = build(exp_model, w.model_copy(update={"seed": 8}), 3)
    assert [i.prompt_token_ids for i in a] != [i.prompt_token_ids for i in c]
    bad = special_ids(exp_model)
    assert bad and not bad & {t for i in a + warm_a for t in i.prompt_token_ids}
    assert all(5 <= len(i.prompt_token_ids) <= 40 and 3 <= i.output_len <= 9 for i in a)
    assert len({len(i.prompt_token_ids) for i in a}) > 1  # really a range
    assert len(warm_a) == 3 and not {i.request_id for i in warm_a} & {i.request_id for i in a}
    assert not {tuple(i.prompt_token_ids) for i in warm_a} & {tuple(i.prompt_token_ids) for i in a}


def test_shared_prefix_groups(exp_model):
    w = Workload(kind="shared_prefix", num_requests=12, num_prefixes=3, prefix_len=10, input_len=6, output_len=4)
    items, _ = build(exp_model, w, 0)
    groups: dict[int, set] = {}
    for k, it in enumerate(items):
        assert len(it.prompt_token_ids) == 16
        groups.setdefault(k % 3, set()).add(tuple(it.prompt_token_ids[:10]))
    assert all(len(s) == 1 for s in groups.values()) and len(set().union(*groups.values())) == 3
    assert len({tuple(it.prompt_token_ids[10:]) for it in items}) == 12  # own suffixes


def test_multi_turn_later_turns_extend_earlier_ones(exp_model):
    w = Workload(kind="multi_turn", num_requests=2, turns=3, input_len=5, output_len=4)
    items, _ = build(exp_model, w, 0)
    assert [i.request_id for i in items] == ["c000-t0", "c000-t1", "c000-t2", "c001-t0", "c001-t1", "c001-t2"]
    for prev, cur in zip(items, items[1:]):
        if cur.after is None:
            continue
        assert cur.after == prev.request_id
        # previous prompt + a 4-token synthetic answer + 5 new user tokens
        assert cur.prompt_token_ids[: len(prev.prompt_token_ids)] == prev.prompt_token_ids
        assert len(cur.prompt_token_ids) == len(prev.prompt_token_ids) + 4 + 5
    assert items[0].after is None and items[3].after is None


def test_sharegpt_file(exp_model):
    w = Workload(kind="sharegpt", path=str(SHAREGPT), num_requests=10, fixed_output=False)
    items, _ = build(exp_model, w, 0)
    tok = load_tokenizer(exp_model)
    questions = {tuple(tok.encode(q).ids) for q in _human_turns()}
    assert len(items) == 10 and all(tuple(i.prompt_token_ids) in questions for i in items)
    assert len({i.output_len for i in items}) > 1  # answer lengths, not a constant
    fixed, _ = build(exp_model, w.model_copy(update={"fixed_output": True, "output_len": 7}), 0)
    assert {i.output_len for i in fixed} == {7}
    with pytest.raises(ValueError, match="usable conversations"):
        build(exp_model, w.model_copy(update={"num_requests": 15}), 0)  # 14 usable in the fixture


def _human_turns() -> list[str]:
    import json

    return [c["conversations"][0]["value"] for c in json.loads(SHAREGPT.read_text())
            if c["conversations"][0]["from"] == "human"]


def test_context_overflow_is_a_clear_error(exp_model):
    with pytest.raises(ValueError, match="exceeds the model's context of 2048"):
        build(exp_model, Workload(num_requests=1, input_len=2000, output_len=100), 0)


def test_normal_ids_cover_the_vocab_minus_specials(exp_model):
    tok = load_tokenizer(exp_model)
    ids = normal_ids(tok)
    assert len(ids) == tok.get_vocab_size(with_added_tokens=True) - len(special_ids(exp_model))


def test_repetitive_prompts_repeat_a_passage_with_few_edits(exp_model):
    from experiments.workload.config import Workload
    from experiments.workload.workloads import build

    w = Workload(kind="repetitive", num_requests=3, input_len=200, output_len=16, period=50, edit_rate=0.04)
    items, _ = build(exp_model, w, 0)
    again, _ = build(exp_model, w, 0)
    assert [it.prompt_token_ids for it in items] == [it.prompt_token_ids for it in again]  # seeded
    for it in items:
        ids = it.prompt_token_ids
        assert len(ids) == 200 and it.output_len == 16
        same = sum(a == b for a, b in zip(ids[:50], ids[50:100]))
        assert 40 <= same < 50 or same == 50  # the second copy matches the first but for a few edits
    assert items[0].prompt_token_ids[:50] != items[1].prompt_token_ids[:50]  # a passage per request
