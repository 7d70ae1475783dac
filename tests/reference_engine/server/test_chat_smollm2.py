"""Chat as vLLM serves it, on the real model: the template resolved as transformers 5 / vLLM resolve it,
`add_generation_prompt`, every EOS id of generation_config.json, no stop token text in the output;
the real OpenAI client against the real `inferlab serve`."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from openai import OpenAI

from reference_engine.tokenizer.tokenizer import Tokenizer, resolve_chat_template
from tests.reference_engine.server.conftest import BASE_FLAGS, Server

QUESTIONS = ["What is the capital of France?", "Name three primary colors.", "List the days of the week."]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def chat_server(smollm2, tmp_path_factory):
    s = Server(smollm2, BASE_FLAGS, None, tmp_path_factory.mktemp("serve-smollm2"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def hf(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2), AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)


def _hf_answer(hf, question: str) -> tuple[list[int], str, str]:
    """(prompt ids, answer text, finish reason) from HF transformers, fp32 greedy, stopping at EOS."""
    tok, model = hf
    ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                  tokenize=True, return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                             eos_token_id=[2], pad_token_id=2)[0, len(ids):].tolist()
    return ids, tok.decode(out, skip_special_tokens=True), "stop" if out[-1] == 2 else "length"


@pytest.mark.slow
def test_chat_route_answers_as_hf_decodes(chat_server, hf):
    client, stops = OpenAI(base_url=chat_server.url + "/v1", api_key="unused", max_retries=0), 0
    for q in QUESTIONS:
        ids, want, finish = _hf_answer(hf, q)
        msgs = [{"role": "user", "content": q}]
        r = client.chat.completions.create(model=str(chat_server.model_dir), messages=msgs,
                                           max_tokens=MAX_TOKENS, temperature=0)
        assert r.choices[0].message.content == want, q
        assert r.usage.prompt_tokens == len(ids)  # the template and add_generation_prompt as HF applies them
        assert r.choices[0].finish_reason == finish  # "stop": at <|im_end|> (id 2, generation_config's EOS)
        stops += finish == "stop"
        stream = client.chat.completions.create(model=str(chat_server.model_dir), messages=msgs, stream=True,
                                                max_tokens=MAX_TOKENS, temperature=0)
        chunks = [c.choices[0] for c in stream if c.choices]
        assert "".join(c.delta.content or "" for c in chunks) == want
        assert chunks[-1].finish_reason == finish
        for text in (r.choices[0].message.content, *(c.delta.content or "" for c in chunks)):
            assert "<|im_end|>" not in text and "<|endoftext|>" not in text
    assert stops >= 2
    r = client.chat.completions.create(model=str(chat_server.model_dir), max_tokens=MAX_TOKENS, temperature=0,
                                       messages=[{"role": "user", "content": QUESTIONS[0]}])
    assert r.choices[0].message.content == "The capital of France is Paris."


@pytest.mark.slow
def test_add_generation_prompt_false_drops_the_assistant_header(chat_server, hf):
    client = OpenAI(base_url=chat_server.url + "/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "Hi"}]
    want = len(hf[0].apply_chat_template(msgs, add_generation_prompt=False, tokenize=True,
                                         return_dict=True)["input_ids"])
    r = client.chat.completions.create(model=str(chat_server.model_dir), messages=msgs, max_tokens=1,
                                       temperature=0, extra_body={"add_generation_prompt": False})
    assert r.usage.prompt_tokens == want


@pytest.mark.slow
def test_chat_template_override_on_serve(launch, tmp_path):
    """`inferlab serve --chat-template FILE` renders with that file, not the model's own template."""
    (tmp_path / "plain.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    s = launch("--chat-template", str(tmp_path / "plain.jinja"))
    client = OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model=str(s.model_dir), messages=[{"role": "user", "content": "a b c"}],
                                       max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == len(Tokenizer(s.model_dir).encode("a b c", add_special_tokens=False))


def _tok_dir(src, dst, template_cfg=None, jinja=None):
    dst.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    if template_cfg is not None:
        cfg["chat_template"] = template_cfg
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    if jinja is not None:
        (dst / "chat_template.jinja").write_text(jinja)
    return dst


def test_template_resolution_order(tiny_llama, tmp_path):
    """chat_template.jinja over tokenizer_config.json (transformers 5 reads the file first); a list of
    named templates gives 'default'; an override (file or literal) over both; a missing file is an error."""
    both = _tok_dir(tiny_llama, tmp_path / "both", template_cfg="CONFIG", jinja="JINJA")
    assert Tokenizer(both).chat_template == "JINJA"
    listed = _tok_dir(tiny_llama, tmp_path / "listed", template_cfg=[{"name": "tool_use", "template": "T"},
                                                                     {"name": "default", "template": "D"}])
    assert Tokenizer(listed).chat_template == "D"
    none = _tok_dir(tiny_llama, tmp_path / "none")
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(none).apply_chat_template([{"role": "user", "content": "x"}])
    (tmp_path / "t.jinja").write_text("FILE")
    assert resolve_chat_template(both, {}, override=str(tmp_path / "t.jinja")) == "FILE"
    assert resolve_chat_template(both, {}, override="{{ messages[0]['content'] }}") == "{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match="does not exist"):
        resolve_chat_template(both, {}, override=str(tmp_path / "missing.jinja"))
