"""Byte-level BPE tokenizer for the generated test models, trained on the corpus the project ships.

The corpus (`data/corpus.txt.gz`) is CPython's own documentation text: `pydoc_data.topics` plus the
docstrings and comments of the standard library (PSF license; see data/README.md). `build_corpus()` regenerates it;
it was run once and its output committed, so training never depends on the interpreter at hand.

Invariants:
- special tokens take ids 0..4 in SPECIALS order: bos, eos, pad, <|im_start|>, <|im_end|>;
- training is deterministic whatever the thread count (the trainer breaks count ties by pair order):
  same vocab size -> byte-identical tokenizer.json;
- `add_bos=True` (Llama 3 convention) makes `encode(text)` prepend bos via the post-processor, and the chat
  template starts with the bos token, so a rendered chat must be encoded with add_special_tokens=False
  (as HF `apply_chat_template(tokenize=True)` and vLLM do). `add_bos=False` is the Qwen convention.
"""
from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

CORPUS = Path(__file__).parents[1] / "data" / "corpus.txt.gz"
BOS, EOS, PAD, IM_START, IM_END = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|im_start|>", "<|im_end|>"
SPECIALS = [BOS, EOS, PAD, IM_START, IM_END]

# Qwen2's pre-tokenizer (NFC + this split + byte-level), used for every family: transformers 5 rebuilds
# qwen2/qwen3 tokenizers with exactly these pieces whatever tokenizer.json says, so only they give the
# same ids from AutoTokenizer and from the raw tokenizer.json.
SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# ChatML; `bos` is prepended only for tokenizers whose convention adds bos (see module docstring).
CHAT_TEMPLATE = (
    "{%- if bos %}{{ bos_token }}{% endif %}"
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_corpus(out: Path = CORPUS) -> int:
    """Write pydoc topics + stdlib docstrings (sorted, deterministic) to `out`; return its size in chars.

    Run once by hand (`python -m reference_engine.tokenizer.make --build-corpus`); the result is shipped.
    """
    import ast
    import io
    import sysconfig
    import tokenize

    import pydoc_data.topics as topics

    parts = [topics.topics[k] for k in sorted(topics.topics)]
    lib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "ensurepip"}
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for path in sorted(lib.rglob("*.py")):
        if skip & set(path.relative_to(lib).parts):
            continue
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
            toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
        except (SyntaxError, UnicodeDecodeError, ValueError, tokenize.TokenError):
            continue
        parts += [d for n in ast.walk(tree) if isinstance(n, kinds) and (d := ast.get_docstring(n))]
        block: list[str] = []  # consecutive comment lines form one paragraph
        for t in toks + [None]:
            if t is not None and t.type == tokenize.COMMENT:
                line = t.string.lstrip("#").strip()
                if line and not line.startswith("!"):
                    block.append(line)
            elif block and (t is None or t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT)):
                parts.append(" ".join(block))
                block = []
    text = "\n\n".join(p.strip() for p in parts) + "\n"
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write(text.encode("utf-8"))
    return len(text)


def corpus_docs() -> list[str]:
    """The shipped corpus split into paragraphs (the training units)."""
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        return [p for p in f.read().split("\n\n") if p.strip()]


@functools.lru_cache(maxsize=4)
def _trained(vocab_size: int) -> str:
    """tokenizer.json text without post-processor; cached because tests make many models."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_docs(), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"corpus yields only {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok.to_str()


def train_tokenizer(vocab_size: int, add_bos: bool):
    """A `tokenizers.Tokenizer` with exactly `vocab_size` tokens; `add_bos` sets the post-processor."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_str(_trained(vocab_size))
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def write_tokenizer(out_dir: Path, vocab_size: int, add_bos: bool, max_len: int) -> dict[str, int]:
    """Write tokenizer.json + tokenizer_config.json; return the special ids {bos, eos, pad}."""
    tok = train_tokenizer(vocab_size, add_bos)
    (out_dir / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, s in enumerate(SPECIALS)}
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": None,
        "additional_special_tokens": [IM_START, IM_END],
        "added_tokens_decoder": added,
        "add_bos_token": add_bos, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE.replace("if bos %", f"if {str(add_bos).lower()} %"),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    return {"bos": SPECIALS.index(BOS), "eos": SPECIALS.index(EOS), "pad": SPECIALS.index(PAD)}


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--build-corpus"]:
        print(f"wrote {CORPUS} ({build_corpus():,} chars)")
    else:
        print("usage: python -m reference_engine.tokenizer.make --build-corpus", file=sys.stderr)
        sys.exit(2)
