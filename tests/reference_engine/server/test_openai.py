"""OpenAI routes through the official `openai` client: greedy tokens equal the offline engine's."""
from __future__ import annotations

import httpx
import pytest
from openai import NotFoundError, OpenAI

from reference_engine import SamplingParams

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,"]
N_TOKENS = 12


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(server) -> str:
    return httpx.get(server.url + "/v1/models").json()["data"][0]["id"]


def greedy(offline, prompt, n=N_TOKENS, **kw):
    return offline.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw))[0]


GREEDY = dict(temperature=0, max_tokens=N_TOKENS, extra_body={"ignore_eos": True, "return_token_ids": True})


@pytest.mark.parametrize("prompt", PROMPTS + [[1, 17, 300, 4000, 25]])
def test_completion_tokens_equal_offline(client, model, offline, prompt):
    want = greedy(offline, prompt)
    r = client.completions.create(model=model, prompt=prompt, **GREEDY)
    c = r.choices[0]
    assert c.token_ids == want.token_ids and len(want.token_ids) == N_TOKENS
    assert c.text == want.text and c.finish_reason == "length"
    assert c.prompt_token_ids == want.prompt_token_ids
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(want.prompt_token_ids), N_TOKENS)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_streamed_completion_equals_offline(client, model, offline, prompt):
    want = greedy(offline, prompt)
    chunks = list(client.completions.create(model=model, prompt=prompt, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    *token_chunks, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == N_TOKENS
    assert last.usage.prompt_tokens == len(want.prompt_token_ids)
    assert all(ch.usage is None for ch in token_chunks)
    assert [t for ch in token_chunks for t in ch.choices[0].token_ids] == want.token_ids
    assert "".join(ch.choices[0].text for ch in token_chunks) == want.text
    assert token_chunks[0].choices[0].prompt_token_ids == want.prompt_token_ids
    assert [ch.choices[0].finish_reason for ch in token_chunks][-1] == "length"
    assert all(ch.choices[0].finish_reason is None for ch in token_chunks[:-1])


def test_stream_without_usage_has_no_usage_chunk(server, model):
    body = {"model": model, "prompt": PROMPTS[0], "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    assert len(events) == 4 and all('"usage"' not in e for e in events)


def test_continuous_usage_stats_count_up(client, model):
    chunks = list(client.completions.create(model=model, prompt=PROMPTS[0], stream=True, stream_options={
        "include_usage": True, "continuous_usage_stats": True}, **GREEDY))
    assert [ch.usage.completion_tokens for ch in chunks] == list(range(1, N_TOKENS + 1)) + [N_TOKENS]


def test_list_prompt_with_n_orders_choices_like_vllm(client, model, offline):
    r = client.completions.create(model=model, prompt=PROMPTS, n=2, **GREEDY)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for i, c in enumerate(r.choices):
        assert c.token_ids == greedy(offline, PROMPTS[i // 2]).token_ids
    prompt_lens = [len(greedy(offline, p).prompt_token_ids) for p in PROMPTS]
    assert r.usage.prompt_tokens == sum(prompt_lens) and r.usage.completion_tokens == 4 * N_TOKENS


def test_completion_logprobs_openai_format(client, model, offline):
    want = greedy(offline, PROMPTS[0], logprobs=3)
    lp = client.completions.create(model=model, prompt=PROMPTS[0], logprobs=3, **GREEDY).choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == N_TOKENS
    assert lp.token_logprobs == pytest.approx([x.logprob for x in want.logprobs], abs=1e-4)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for tok, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert tok in top and 1 <= len(top) <= 4
        assert chosen == pytest.approx(max(top.values()), abs=1e-5)  # greedy picks the most likely


def test_stop_string_and_seed(client, model, offline):
    text = greedy(offline, PROMPTS[1], n=20).text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    r = client.completions.create(model=model, prompt=PROMPTS[1], stop=[stop], temperature=0, max_tokens=20)
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.model_extra["stop_reason"] == stop
    assert c.text == text[:text.index(stop)]
    sampled = [client.completions.create(model=model, prompt=PROMPTS[1], temperature=1.0, seed=1234, max_tokens=10,
                                         extra_body={"ignore_eos": True, "return_token_ids": True})
               .choices[0].token_ids for _ in range(2)]
    assert sampled[0] == sampled[1]
    want = offline.generate([PROMPTS[1]], SamplingParams(max_tokens=10, temperature=1.0, seed=1234,
                                                         ignore_eos=True))[0]
    assert sampled[0] == want.token_ids


def chat_ids(offline, messages):
    tok = offline.tokenizer
    return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)


def test_chat_stream_and_not_equal_offline(client, model, offline):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    want = greedy(offline, chat_ids(offline, messages))
    r = client.chat.completions.create(model=model, messages=messages, **GREEDY)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want.text
    assert r.choices[0].token_ids == want.token_ids and r.model_extra["prompt_token_ids"] == want.prompt_token_ids
    chunks = list(client.chat.completions.create(model=model, messages=messages, stream=True, **GREEDY))
    first, rest = chunks[0], chunks[1:]
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert first.model_extra["prompt_token_ids"] == want.prompt_token_ids
    assert "".join(ch.choices[0].delta.content or "" for ch in rest) == want.text
    assert [t for ch in rest for t in ch.choices[0].token_ids] == want.token_ids
    assert rest[-1].choices[0].finish_reason == "length"


def test_chat_default_max_tokens_is_rest_of_context(client, model, offline):
    from .conftest import MAX_MODEL_LEN

    messages = [{"role": "user", "content": "Count to a thousand."}]
    r = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == len(chat_ids(offline, messages))
    assert r.usage.prompt_tokens + r.usage.completion_tokens == MAX_MODEL_LEN
    assert r.choices[0].finish_reason == "length"


def test_chat_logprobs(client, model):
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], logprobs=True,
                                       top_logprobs=2, **GREEDY)
    content = r.choices[0].logprobs.content
    assert len(content) == N_TOKENS
    for e in content:
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-5)
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token or not e.token


def test_models_and_unknown_model(client, model, server, model_dir):
    ids = [m.id for m in client.models.list().data]
    assert ids == [str(model_dir)] == [model]  # the model argument as given, as vLLM names it
    with pytest.raises(NotFoundError) as err:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    assert err.value.body["type"] == "not_found_error" and err.value.body["param"] == "model"
