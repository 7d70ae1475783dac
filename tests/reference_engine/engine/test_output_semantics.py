"""Output semantics that must equal vLLM v1's (issue 21): stop tokens' text, include_stop_str_in_output,
min_tokens, and the seeds of n > 1 choices. Unit level, on the tiny model's tokenizer; the same rules
are checked against a real vLLM server in tests/reference_engine/server/test_vs_vllm_outputs.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from reference_engine import SamplingParams
from reference_engine.engine.output_processor import OutputProcessor
from reference_engine.core.request import Request
from reference_engine.tokenizer.tokenizer import Tokenizer

PROMPT = [11, 12, 13]


@pytest.fixture(scope="module")
def tok(tiny_llama) -> Tokenizer:
    return Tokenizer(tiny_llama)


def run(tok: Tokenizer, tokens: list[int], **kw) -> tuple[str, str | None, int | str | None, str]:
    """Feed `tokens` one step at a time -> (final text, finish_reason, stop_reason, streamed text)."""
    out = OutputProcessor(tok, {tok.eos_token_id}, max_model_len=256)
    req = Request("r", PROMPT, SamplingParams(**{"max_tokens": 64, **kw}))
    out.add(req)
    streamed = ""
    for t in tokens:
        d = out.process(req, [t], None)
        streamed += d.text_delta
        if d.finished:
            break
    return streamed, req.finish_reason, req.stop_reason, tok.decode(req.output_token_ids, False)


def test_stop_token_text_is_not_in_the_output(tok):
    a, b, c = 300, 301, 302
    plain, *_ = run(tok, [a, b], max_tokens=2)
    text, reason, stop, _ = run(tok, [a, b, c, 303], stop_token_ids=[c])
    assert (text, reason, stop) == (plain, "stop", c)  # was plain + the text of `c`
    text, *_ = run(tok, [a, b, c], stop_token_ids=[c], include_stop_str_in_output=True)
    assert text == run(tok, [a, b, c], max_tokens=3)[0]


def test_eos_text_is_not_in_the_output_without_skip_special_tokens(tok):
    eos = tok.eos_token_id
    plain, *_ = run(tok, [300, 301], max_tokens=2, skip_special_tokens=False)
    text, reason, stop, _ = run(tok, [300, 301, eos], skip_special_tokens=False)
    assert (text, reason, stop) == (plain, "stop", None)
    text, *_ = run(tok, [300, 301, eos], skip_special_tokens=False, include_stop_str_in_output=True)
    assert text.endswith(tok.eos_token) and text == run(tok, [300, 301, eos], max_tokens=3, ignore_eos=True,
                                                        skip_special_tokens=False)[0]


def test_include_stop_str_in_output_and_min_tokens(tok):
    ids = list(range(300, 310))
    full, *_ = run(tok, ids, max_tokens=10)
    stop = full[len(run(tok, ids[:2], max_tokens=2)[0]):][:3]  # three characters made by token 3 on
    assert stop and stop in full
    cut = full.index(stop)
    assert run(tok, ids, stop=[stop])[:3] == (full[:cut], "stop", stop)
    assert run(tok, ids, stop=[stop], include_stop_str_in_output=True)[:3] == (full[:cut + 3], "stop", stop)
    # min_tokens: a stop string that ends within the first min_tokens tokens' text does not count
    n = next(k for k in range(1, 11) if len(run(tok, ids[:k], max_tokens=k)[0]) >= cut + 3)
    after_n = len(run(tok, ids[:n], max_tokens=n)[0])
    later = [i for i in range(len(full)) if full.startswith(stop, i) and i + len(stop) > after_n]
    want = (full[:later[0]], "stop") if later else (full, "length")
    assert run(tok, ids, stop=[stop], min_tokens=n, max_tokens=10)[:2] == want


def test_n_choices_with_a_seed_get_seed_plus_index():
    from reference_engine.server.generation import Choices, Gate

    seen = []
    engine = SimpleNamespace(add_request=lambda ids, p, **kw: seen.append(p.seed), abort=lambda rid: None, is_alive=True)
    state = SimpleNamespace(engine=engine, gate=Gate(16))
    Choices(state, [[1, 2], [3]], SamplingParams(seed=7, temperature=1.0), n=3)
    assert seen == [7, 8, 9, 7, 8, 9]  # vLLM: child j of every prompt gets seed + j
    seen.clear()
    Choices(state, [[1]], SamplingParams(temperature=1.0), n=2)
    assert seen == [None, None]


def test_an_incomplete_character_at_the_end_is_dropped(tok):
    # token ids whose text is half a UTF-8 character: vLLM's DecodeStream never emits it
    half = next(i for i in range(3, tok.vocab_size) if tok.decode([300, i]).endswith("\ufffd"))
    text, reason, _, _ = run(tok, [300, half, tok.eos_token_id], skip_special_tokens=False)
    assert (text, reason) == (run(tok, [300], max_tokens=1)[0], "stop")
