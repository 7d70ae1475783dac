"""The model maker: deterministic files that HF transformers loads, a working tokenizer, a strict CLI."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from experiments.cli import main as inferlab
from reference_engine.model.make import build_config, make_model, param_count
from reference_engine.tokenizer.make import train_tokenizer

ROOT = Path(__file__).resolve().parents[3]
FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
TEXTS = ["def f(x):\n    return x + 1  # done", "Ünïcödé 世界 🙂 and  two  spaces\r\n", "It's 12345 o'clock", ""]


def digests(d: Path) -> dict[str, str]:
    return {f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in FILES}


def tensors(d: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_same_seed_is_byte_identical_across_processes(tiny_llama, tmp_path):
    out = tmp_path / "again"
    env = {**os.environ, "RAYON_RS_NUM_CPUS": "1"}  # tokenizer training must not depend on the thread count
    subprocess.run([sys.executable, "-m", "reference_engine.model.make", str(out)], cwd=ROOT, env=env, check=True)
    assert digests(out) == digests(tiny_llama)


def test_different_seed_changes_only_the_weights(tiny_llama, make_tiny):
    a, b = digests(tiny_llama), digests(make_tiny("llama", seed=1))
    assert a["model.safetensors"] != b["model.safetensors"]
    assert {k: v for k, v in a.items() if k != "model.safetensors"} == \
        {k: v for k, v in b.items() if k != "model.safetensors"}


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_tiny_parameter_count(make_tiny, family):
    d = make_tiny(family)
    cfg = json.loads((d / "config.json").read_text())
    n = sum(t.numel() for t in tensors(d).values())
    assert n == param_count(cfg)
    assert 5_000_000 <= n <= 10_000_000
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]


def test_small_preset_size_from_config():
    cfg = build_config("small", "llama")
    assert 90_000_000 <= param_count(cfg) <= 115_000_000
    assert cfg["vocab_size"] >= 32_000


def test_small_vocabulary_trains_in_full():
    assert train_tokenizer(32768, add_bos=True).get_vocab_size() == 32768


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_transformers_loads_and_runs(make_tiny, family):
    d = make_tiny(family)
    model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert type(model).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                    "qwen3": "Qwen3ForCausalLM"}[family]
    assert model.dtype == torch.float32
    cfg = model.config
    assert cfg.rope_parameters["rope_theta"] == 10000.0 and cfg.tie_word_embeddings
    if family == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    if family == "qwen3":  # head_dim is decoupled from hidden_size / num_heads
        assert cfg.head_dim != cfg.hidden_size // cfg.num_attention_heads
        assert model.model.layers[0].self_attn.q_norm.weight.shape == (cfg.head_dim,)
    ids = torch.tensor([[0, 17, 400, 5000, 9]])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 5, cfg.vocab_size) and torch.isfinite(logits).all()
    assert logits[0, -1].std() > 0.5  # spread out, so greedy argmax is not decided by rounding


def test_config_overrides(make_tiny):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256}
    d = make_tiny("llama", rope_scaling=scaling, tie_word_embeddings=False, torch_dtype="bfloat16")
    raw = json.loads((d / "config.json").read_text())
    assert raw["rope_scaling"] == scaling and raw["rope_theta"] == 10000.0  # 4.x keys
    cfg = AutoConfig.from_pretrained(d)
    assert cfg.rope_parameters["rope_type"] == "llama3" and cfg.rope_parameters["factor"] == 8.0
    w = tensors(d)
    assert "lm_head.weight" in w and all(t.dtype == torch.bfloat16 for t in w.values())
    model = AutoModelForCausalLM.from_pretrained(d)
    assert model.dtype == torch.bfloat16 and not model.config.tie_word_embeddings


def test_bad_overrides_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="num_key_value_heads"):
        make_model(tmp_path / "m", config_overrides={"num_key_value_heads": 3})
    with pytest.raises(ValueError, match="torch_dtype"):
        make_model(tmp_path / "m", config_overrides={"torch_dtype": "int8"})


@pytest.mark.parametrize("family,bos", [("llama", True), ("qwen2", False), ("qwen3", False)])
def test_tokenizer_matches_raw_and_round_trips(make_tiny, family, bos):
    d = make_tiny(family)
    hf, raw = AutoTokenizer.from_pretrained(d), Tokenizer.from_file(str(d / "tokenizer.json"))
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (0, 1, 2)
    for text in TEXTS:
        ids = hf.encode(text)
        assert ids == raw.encode(text).ids
        assert (ids[:1] == [0]) == bos
        assert hf.decode(ids, skip_special_tokens=True) == text
    assert hf.decode(hf.encode("<|im_start|>hi<|im_end|>"), skip_special_tokens=True) == "hi"


@pytest.mark.parametrize("family,prefix", [("llama", "<|begin_of_text|>"), ("qwen3", "")])
def test_chat_template(make_tiny, family, prefix):
    hf = AutoTokenizer.from_pretrained(make_tiny(family))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == prefix + ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                             "<|im_start|>assistant\n")
    ids = hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)["input_ids"]
    assert ids == hf.encode(text, add_special_tokens=False)  # no doubled bos


def test_generation_config(tiny_llama):
    gen = json.loads((tiny_llama / "generation_config.json").read_text())
    assert gen == {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}


@pytest.mark.parametrize("args,needle", [
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--family", "gpt2"], "unknown family 'gpt2'"),
    (["--seed", "x"], "invalid int value"),
])
def test_cli_bad_arguments(tmp_path, capsys, args, needle):
    assert inferlab(["make-model", str(tmp_path / "m"), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert not (tmp_path / "m").exists()


def test_cli_refuses_non_empty_dir_unless_forced(tmp_path, capsys):
    d = tmp_path / "m"
    d.mkdir()
    (d / "notes.txt").write_text("keep")
    assert inferlab(["make-model", str(d)]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and "--force" in err and err.count("\n") == 1
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]
    assert inferlab(["make-model", str(d), "--force", "--family", "qwen2", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "parameters" in out and set(FILES) <= {p.name for p in d.iterdir()}


def test_cli_writes_into_an_empty_existing_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    assert inferlab(["make-model", str(tmp_path / "empty")]) == 0
    assert (tmp_path / "empty" / "model.safetensors").exists()


VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.skipif(not VLLM_PY.exists(), reason="no .venv-vllm")
def test_vllm_transformers_reads_it(make_tiny):
    """vLLM's own transformers version reads each family's config and gives the same token ids as ours."""
    dirs = [make_tiny(f) for f in ("llama", "qwen2", "qwen3")]
    code = ("import sys, json; from transformers import AutoConfig, AutoTokenizer\n"
            "for d in sys.argv[2:]:\n"
            "    c, t = AutoConfig.from_pretrained(d), AutoTokenizer.from_pretrained(d)\n"
            "    print(json.dumps([c.model_type, c.head_dim, t.encode(sys.argv[1])]))")
    out = subprocess.run([str(VLLM_PY), "-c", code, TEXTS[0], *map(str, dirs)],
                         capture_output=True, text=True, check=True)
    got = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[")]
    want = [[json.loads((d / "config.json").read_text())["model_type"],
             json.loads((d / "config.json").read_text())["head_dim"],
             AutoTokenizer.from_pretrained(d).encode(TEXTS[0])] for d in dirs]
    assert got == want


def test_cyclic_model_walks_cycles_in_hf_and_in_the_engine(tmp_path):
    from reference_engine import LLM, SamplingParams

    d = make_model(tmp_path / "cyc", cycle=8)
    prompt = list(range(100, 140))
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):].tolist()
    assert want[8:] == want[:-8] and len(set(want)) == 8  # a cycle of 8 tokens
    got = LLM(str(d)).generate([prompt], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
    assert list(got.token_ids) == want and not ({0, 1, 2} & set(want))  # specials unreachable
    with pytest.raises(ValueError, match="cycle"):
        make_model(tmp_path / "bad", cycle=1)


def test_draft_of_keeps_the_first_layers_and_the_tokenizer(tiny_llama, tmp_path):
    assert inferlab(["make-model", str(tmp_path / "draft"), "--draft-of", str(tiny_llama), "--layers", "1"]) == 0
    cfg = json.loads((tmp_path / "draft/config.json").read_text())
    assert cfg["num_hidden_layers"] == 1
    assert (tmp_path / "draft/tokenizer.json").read_bytes() == (tiny_llama / "tokenizer.json").read_bytes()
    full, cut = tensors(tiny_llama), tensors(tmp_path / "draft")
    assert set(cut) == {k for k in full if not k.startswith("model.layers.") or k.startswith("model.layers.0.")}
    assert all(torch.equal(cut[k], full[k]) for k in cut)
    AutoModelForCausalLM.from_pretrained(tmp_path / "draft")  # HF loads it as a 1-layer model
    assert inferlab(["make-model", str(tmp_path / "d2"), "--draft-of", str(tiny_llama), "--layers", "9"]) == 2
