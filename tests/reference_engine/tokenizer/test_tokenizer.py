from __future__ import annotations

from transformers import AutoTokenizer

from reference_engine.tokenizer.tokenizer import IncrementalDetokenizer, Tokenizer

TEXT = "Héllo, wörld! 你好 — streaming détokenization 🙂 works; def f(x): return x ** 2"


def test_ids_match_autotokenizer(tiny_llama):
    ours = Tokenizer(tiny_llama)
    hf = AutoTokenizer.from_pretrained(str(tiny_llama))
    assert ours.encode(TEXT) == hf(TEXT)["input_ids"]
    ids = ours.encode(TEXT, add_special_tokens=False)
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert ours.eos_token_id == hf.eos_token_id


def test_incremental_detokenizer_equals_full_decode(tiny_llama):
    tok = Tokenizer(tiny_llama)
    ids = tok.encode(TEXT, add_special_tokens=False)
    d = IncrementalDetokenizer(tok, prompt_ids=tok.encode("Prompt:"))
    pieces = [d.add([t]) for t in ids]
    assert "".join(pieces) == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)  # never half a character


def test_chat_template_renders(tiny_llama):
    tok = Tokenizer(tiny_llama)
    hf = AutoTokenizer.from_pretrained(str(tiny_llama))
    msgs = [{"role": "user", "content": "hi there"}]
    assert tok.apply_chat_template(msgs) == hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
