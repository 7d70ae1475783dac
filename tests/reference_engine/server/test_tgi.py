"""TGI routes through `huggingface_hub.InferenceClient`, unchanged: greedy tokens equal the offline engine's."""
from __future__ import annotations

import json

import httpx
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError

from reference_engine import SamplingParams

PROMPT = "In the beginning the Universe was created."
N = 10


@pytest.fixture(scope="module")
def hf(server) -> InferenceClient:
    return InferenceClient(base_url=server.url)


def offline_greedy(offline, prompt=PROMPT, n=N):
    # TGI has no ignore_eos: both sides stop at EOS the same way
    return offline.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0))[0]


def test_text_generation_details_equal_offline(hf, offline):
    want = offline_greedy(offline)
    out = hf.text_generation(PROMPT, max_new_tokens=N, details=True)
    assert [t.id for t in out.details.tokens] == want.token_ids
    assert out.generated_text == want.text
    assert out.details.generated_tokens == len(want.token_ids)
    assert out.details.finish_reason == ("length" if want.finish_reason == "length" else "eos_token")
    assert out.details.seed is None  # greedy: no seed used
    assert all(t.logprob <= 0 for t in out.details.tokens)
    assert hf.text_generation(PROMPT, max_new_tokens=N) == want.text


def test_text_generation_stream_details_equal_offline(hf, offline):
    want = offline_greedy(offline)
    events = list(hf.text_generation(PROMPT, max_new_tokens=N, stream=True, details=True))
    assert [e.token.id for e in events] == want.token_ids
    assert [e.index for e in events] == list(range(1, len(events) + 1))
    assert all(e.generated_text is None and e.details is None for e in events[:-1])
    last = events[-1]
    assert last.generated_text == want.text == "".join(e.token.text for e in events if not e.token.special)
    assert last.details.generated_tokens == len(want.token_ids)
    assert last.details.input_length == len(want.prompt_token_ids)
    assert list(hf.text_generation(PROMPT, max_new_tokens=N, stream=True)) == [e.token.text for e in events]


def test_compat_route_dispatches_on_stream(server, offline):
    want = offline_greedy(offline, n=4)
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "details": True}}
    r = httpx.post(server.url + "/", json=body)
    assert isinstance(r.json(), list) and [t["id"] for t in r.json()[0]["details"]["tokens"]] == want.token_ids
    with httpx.stream("POST", server.url + "/", json=body | {"stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert [e["token"]["id"] for e in events] == want.token_ids
    assert events[-1]["generated_text"] == want.text and events[-1]["details"]["finish_reason"] in ("length",
                                                                                                     "eos_token")


def test_sampling_seed_is_reported_and_reproducible(hf):
    a = hf.text_generation(PROMPT, max_new_tokens=8, do_sample=True, seed=7, details=True)
    b = hf.text_generation(PROMPT, max_new_tokens=8, do_sample=True, seed=7, details=True)
    assert a.details.seed == 7 and [t.id for t in a.details.tokens] == [t.id for t in b.details.tokens]
    c = hf.text_generation(PROMPT, max_new_tokens=8, temperature=0.9, details=True)  # a warper turns sampling on
    assert isinstance(c.details.seed, int)
    d = hf.text_generation(PROMPT, max_new_tokens=8, temperature=0.9, seed=c.details.seed, details=True)
    assert [t.id for t in c.details.tokens] == [t.id for t in d.details.tokens]


def test_stop_sequence_and_top_tokens(hf, offline):
    text = offline_greedy(offline, n=16).text
    stop = text[6:9]
    out = hf.text_generation(PROMPT, max_new_tokens=16, stop=[stop], details=True, top_n_tokens=3)
    assert out.details.finish_reason == "stop_sequence" and out.generated_text == text[:text.index(stop)]
    assert all(len(top) == 3 for top in out.details.top_tokens)
    full = hf.text_generation(PROMPT, max_new_tokens=2, return_full_text=True)
    assert full.startswith(PROMPT) and len(full) > len(PROMPT)


@pytest.mark.parametrize("kwargs,message", [
    (dict(temperature=0.0), "temperature"), (dict(top_p=1.0), "top_p"), (dict(top_k=0), "top_k"),
    (dict(max_new_tokens=100000), "context"), (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
    (dict(best_of=2, do_sample=True), "best_of"), (dict(watermark=True), "watermark")])
def test_validation_errors_are_tgi_422(hf, kwargs, message):
    with pytest.raises(ValidationError, match=message):
        hf.text_generation(PROMPT, **kwargs)


def test_validation_error_body_and_status(server):
    r = httpx.post(server.url + "/generate", json={"inputs": "", "parameters": {}})
    assert r.status_code == 422 and r.json() == {"error": "`inputs` cannot be empty", "error_type": "validation"}
    r = httpx.post(server.url + "/generate_stream", content=b"{nope")
    assert r.status_code == 422 and r.json()["error_type"] == "validation"


def test_info_and_tokenize(server, offline):
    from .conftest import MAX_MODEL_LEN

    info = httpx.get(server.url + "/info").json()
    assert info["max_total_tokens"] == MAX_MODEL_LEN and info["max_input_tokens"] == MAX_MODEL_LEN - 1
    assert info["model_id"] == str(server.model_dir) and info["version"]
    toks = httpx.post(server.url + "/tokenize", json={"inputs": PROMPT}).json()
    assert [t["id"] for t in toks] == offline.tokenizer.encode(PROMPT)
    assert "".join(t["text"] for t in toks) == PROMPT
    assert all(PROMPT[t["start"]:t["stop"]] == t["text"] for t in toks)


def test_tgi_parameters_are_strictly_typed_as_tgi_parses_them():
    # TGI deserializes with serde: a 0 is not a bool and a bool is not a float (422, not a 200)
    from pydantic import ValidationError

    from reference_engine.server.protocol import TGIParameters

    for bad in ({"watermark": 0}, {"repetition_penalty": True}, {"max_new_tokens": 1.5}):
        with pytest.raises(ValidationError):
            TGIParameters(**bad)
    assert TGIParameters(temperature=1, max_new_tokens=4).temperature == 1.0  # an integer is a number
