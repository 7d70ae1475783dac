"""Real-text workloads (experiments/workload/realtext.py) on SmolLM2's real tokenizer and chat template: seeded,
templated as transformers templates, lengths from the tokenizer, growing conversations, real stdlib
code; config errors are one line (exit 2). Only tokenizers here: no forward pass of the real model."""
from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest

from experiments.commands.run import run_main
from experiments.workload import realtext
from experiments.workload.config import Config, ConfigError, Workload, load
from experiments.workload.workloads import build, describe, load_tokenizer

KINDS = {"chat": dict(num_requests=12, output_len=64),
         "summarize": dict(num_requests=6, input_len=[300, 600], output_len=64),
         "multi_turn_chat": dict(num_requests=3, turns=3, output_len=[20, 40]),
         "code": dict(num_requests=6, input_len=[100, 200], output_len=64)}


def _ids(items):
    return [(i.request_id, i.prompt_token_ids, i.output_len, i.after) for i in items]


def test_seeded_and_the_same_ids_as_transformers_chat_template(smollm2):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(smollm2))
    tail = hf.encode("<|im_start|>assistant\n", add_special_tokens=False)  # what add_generation_prompt adds
    for kind, kw in KINDS.items():
        w = Workload(kind=kind, template="engine", **kw)
        items, warm = build(smollm2, w, 2)
        # built again: the same seed gives the same ids; "harness" sends them without the messages
        harness, _ = build(smollm2, w.model_copy(update={"template": "harness"}), 0)
        assert _ids(harness) == _ids(items) and all(i.messages is None for i in harness)
        if kind == "chat":
            other, _ = build(smollm2, w.model_copy(update={"seed": 1}), 0)
            assert [i.prompt_token_ids for i in items] != [i.prompt_token_ids for i in other]
        for it in items:
            want = hf.apply_chat_template(it.messages, add_generation_prompt=True, tokenize=True)
            assert it.prompt_token_ids == list(want["input_ids"] if hasattr(want, "keys") else want)
            assert it.messages[-1]["role"] == "user" and it.prompt_token_ids[-len(tail):] == tail
        assert len({tuple(i.prompt_token_ids) for i in items}) == len(items)  # no two prompts alike
        assert len(warm) == 2


def test_lengths_follow_the_real_tokenizer(smollm2):
    tok = load_tokenizer(smollm2)
    items, _ = build(smollm2, Workload(kind="summarize", num_requests=8, input_len=[300, 600], template="engine"), 0)
    system = items[0].messages[0]
    for it in items:  # one shared system prompt, then a document body of about input_len tokens
        assert it.messages[0] == system and system["content"] == realtext.SUMMARY_SYSTEM
        body = it.messages[1]["content"].removeprefix(realtext.SUMMARY_ASK)
        n = len(tok.encode(body, add_special_tokens=False).ids)
        assert 300 * 0.9 <= n <= 600 + 200  # whole lines: it stops at the first line past the target
    head = min(len(i.prompt_token_ids) for i in items)
    shared = next(k for k in range(head) if len({tuple(i.prompt_token_ids[:k + 1]) for i in items}) > 1)
    assert shared >= len(tok.encode(realtext.SUMMARY_SYSTEM).ids)  # the system prompt's tokens are one prefix
    d = describe(items, Workload(kind="summarize"))
    lens = sorted(len(i.prompt_token_ids) for i in items)
    assert (d["prompt_tokens"]["min"], d["prompt_tokens"]["max"], d["prompt_tokens"]["n"]) == (lens[0], lens[-1], 8)
    assert d["sources"]["python"] == sysconfig.get_python_version() + d["sources"]["python"][4:]
    assert d["sources"]["text"] == "pydoc_data.topics"


def test_conversations_grow_turn_by_turn(smollm2):
    items, _ = build(smollm2, Workload(kind="multi_turn_chat", num_requests=2, turns=3, output_len=32,
                                       template="engine"), 0)
    assert [i.request_id for i in items] == ["c000-t0", "c000-t1", "c000-t2", "c001-t0", "c001-t1", "c001-t2"]
    for prev, cur in zip(items, items[1:]):
        if cur.after is None:
            continue
        assert cur.after == prev.request_id
        # the next turn is the whole conversation so far: its ids extend the previous turn's token for token
        assert cur.prompt_token_ids[:len(prev.prompt_token_ids)] == prev.prompt_token_ids
        assert len(cur.prompt_token_ids) > len(prev.prompt_token_ids) + 20
        assert cur.messages[:len(prev.messages)] == prev.messages and cur.messages[-2]["role"] == "assistant"
    assert items[0].after is None and items[3].after is None


def test_code_is_real_stdlib_source(smollm2):
    w = Workload(kind="code", num_requests=5, input_len=[80, 160], template="engine")
    items, _ = build(smollm2, w, 0)
    raw, _ = build(smollm2, w.model_copy(update={"template": "none"}), 0)
    tok = load_tokenizer(smollm2)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for it, r in zip(items, raw):
        code = it.messages[0]["content"].removeprefix(realtext.CODE_ASK)
        module = stdlib / (it.request_id.split("-", 1)[1] + ".py")
        assert code.rstrip("\n") in module.read_text(encoding="utf-8")  # a real slice of that module
        assert code.lstrip().startswith(("def ", "class ", "async def "))
        assert r.prompt_token_ids == tok.encode(code).ids and r.messages is None  # no template: the code alone


def test_config_defaults_and_one_line_errors(tmp_path, exp_model, capsys):
    assert Config(name="x", model=str(exp_model), engine="reference", workload={"kind": "chat"}).sampling.ignore_eos \
        is False  # real text ends at EOS
    cfg = Config(name="x", model=str(exp_model), engine="reference", workload={"kind": "code"},
                 sampling={"ignore_eos": True})
    assert cfg.sampling.ignore_eos is True  # unless the config asks for ignore_eos
    assert Config(name="x", model=str(exp_model), engine="reference").sampling.ignore_eos is True
    bad = {"kind = \"poetry\"": "workload.kind: Input should be", "kind = \"random\"\ntemplate = \"engine\"":
           "workload: workload.template = 'engine' needs a real-text kind",
           "kind = \"chat\"\ntemplate = \"jinja\"": "workload.template: Input should be"}
    for body, msg in bad.items():
        p = tmp_path / "bad.toml"
        p.write_text(f'name = "x"\nmodel = "{exp_model}"\nengine = "reference"\n[workload]\n{body}\n')
        with pytest.raises(ConfigError, match=msg):
            load(p)
        assert run_main([str(p), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1
    # a model without a chat template: one line naming the fix, before any engine starts
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "tokenizer.json"):
        shutil.copy(exp_model / f, bare / f)
    p.write_text(f'name = "x"\nmodel = "{bare}"\nengine = "reference"\n[workload]\nkind = "chat"\n')
    assert run_main([str(p), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no chat template" in err and 'template = "none"' in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out" / "x").exists()


@pytest.mark.slow  # a real `inferlab serve` (tiny model): about 10 s on 2 cores
def test_chat_route_sends_messages_and_the_report_counts_endings(exp_model, tmp_path, capsys):
    """template = "engine" through the real harness and `inferlab serve`: the server is given its own
    chat template (a system turn the harness's rendering lacks), so the prompt it reports is longer
    than the harness's ids, which proves the messages went through its chat route and its template."""
    own = tmp_path / "own.jinja"
    from reference_engine.tokenizer.tokenizer import Tokenizer

    own.write_text("<|im_start|>system\nBe brief.<|im_end|>" + Tokenizer(exp_model).chat_template)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'name = "route"\nmodel = "{exp_model}"\nengine = "reference"\n'
                   f'[engine_options.reference]\nmode = "server"\nextra_args = ["--chat-template", "{own}"]\n'
                   '[workload]\nkind = "multi_turn_chat"\ntemplate = "engine"\nnum_requests = 2\nturns = 2\n'
                   'output_len = 6\n[load]\nconcurrency = [2]\nwarmup = 0\n')
    assert run_main([str(cfg), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    run = tmp_path / "out" / "route"
    import json

    recs = [json.loads(ln) for ln in (run / "reference" / "requests.jsonl").read_text().splitlines()]
    extra = len(load_tokenizer(exp_model).encode("<|im_start|>system\nBe brief.<|im_end|>",
                                                  add_special_tokens=False).ids)
    assert len(recs) == 4 and all(r["prompt_tokens_reported"] == len(r["prompt_token_ids"]) + extra for r in recs)
    report = (run / "report.md").read_text()
    manifest = json.loads((run / "workload.json").read_text())
    assert manifest["template"] == "engine" and manifest["sources"]["text"] == "pydoc_data.topics"
    assert "sent to each engine's own `/v1/chat/completions`" in report
    eos = sum(r["finish_reason"] == "stop" for r in recs)
    assert f"| reference | concurrency=2 | 4 | {eos} | {4 - eos} |" in report  # ended at EOS vs at max tokens
    assert "end at EOS (no `ignore_eos`)" in report and "stopped before max_tokens (" not in report


def test_chat_requests_go_to_the_chat_route_with_the_same_sampling():
    from adapters.base import GenerationRequest, SamplingConfig
    from adapters.transport.openai import OpenAIEngine

    engine = OpenAIEngine("m", "float32", {"url": "http://x"})
    engine.served_model_name = "m"
    s = SamplingConfig(max_tokens=5, ignore_eos=False, stop=["\n"])
    msgs = [{"role": "user", "content": "hi"}]
    chat = engine._completion_body(GenerationRequest("r", [1, 2], s, messages=msgs))
    plain = engine._completion_body(GenerationRequest("r", [1, 2], s))
    assert chat.pop("messages") == msgs and plain.pop("prompt") == [1, 2] and chat == plain
    # a chat chunk's text is in delta.content (vLLM and our server put the ids in token_ids alike)
    got = engine._parse_chunk({"choices": [{"index": 0, "delta": {"content": "Hi"}, "token_ids": [7],
                                            "finish_reason": None}]})
    assert (got.token_ids, got.text, got.finish_reason) == ([7], "Hi", None)
    role = engine._parse_chunk({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    assert (role.token_ids, role.text) == (None, "")


def test_requests_ended_at_eos_are_not_retokenization_mismatches(exp_model):
    from experiments.measuring.metrics import token_checks

    tok = load_tokenizer(exp_model)
    ids = tok.encode("The cat sat on the mat.", add_special_tokens=False).ids
    eos = tok.token_to_id("<|im_end|>")

    def retok(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    rec = {"text": "The cat sat on the mat.", "prompt_token_ids": [1], "output_len": 32}
    at_eos = {**rec, "output_token_ids": ids + [eos], "finish_reason": "stop"}  # EOS's text is not in the text
    at_length = {**rec, "output_token_ids": ids, "finish_reason": "length"}
    assert token_checks([at_eos, at_length], retok)["retokenized_mismatch"] == 0
    assert token_checks([{**at_length, "output_token_ids": ids + [eos]}], retok)["retokenized_mismatch"] == 1


def test_a_config_makes_the_real_model_from_its_preset(tmp_path, capsys, smollm2):
    """make_model = { preset = "smollm2-135m-instruct" } makes the real model (from the cache the smollm2
    fixture filled); the workload is then built on its tokenizer (here: too long for its context)."""
    model = tmp_path / "models" / "smollm2"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'name = "x"\nmodel = "{model}"\nmake_model = {{ preset = "smollm2-135m-instruct" }}\n'
                   'engine = "reference"\n[workload]\nkind = "summarize"\nnum_requests = 1\ninput_len = 8000\n'
                   'output_len = 400\n')
    assert run_main([str(cfg), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "exceeds the model's context of 8192" in err.splitlines()[-1]
    assert (model / "chat_template.jinja").read_text() == (smollm2 / "chat_template.jinja").read_text()
