"""Tokenization: text <-> token ids from an HF `tokenizer.json`, plus streaming detokenization.

We use the `tokenizers` library directly (the Rust core under HF's fast tokenizers), and
read `tokenizer_config.json` for special tokens and the chat template, so the ids equal
what `AutoTokenizer` gives for the same directory.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _RustTokenizer


def _token_str(value: Any) -> str | None:
    if isinstance(value, dict):  # older configs store AddedToken dicts
        return value.get("content")
    return value


def resolve_chat_template(model_dir: Path, config: dict[str, Any], override: str | None = None) -> str | None:
    """The chat template as transformers 5 and vLLM pick it: an explicit override (vLLM's `--chat-template`:
    a file path, or the template itself), else `chat_template.jinja` (where transformers 5 saves it), else
    `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates: 'default')."""
    if override is not None:
        path = Path(override)
        looks_like_path = "{" not in override and ("/" in override or override.endswith((".jinja", ".j2")))
        if path.is_file():
            return path.read_text(encoding="utf-8")
        if looks_like_path:
            raise ValueError(f"chat template file {override!r} does not exist")
        return override
    jinja = Path(model_dir) / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    tpl = config.get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        return named.get("default")
    return tpl


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in model directory {model_dir}")
        try:
            self._tok = _RustTokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception on bad JSON
            raise ValueError(f"malformed tokenizer.json in {model_dir}: {e}") from e
        cfg_path = model_dir / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.chat_template: str | None = resolve_chat_template(model_dir, self.config)
        self.bos_token = _token_str(self.config.get("bos_token"))
        self.eos_token = _token_str(self.config.get("eos_token"))
        self.pad_token = _token_str(self.config.get("pad_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.pad_token_id = self._tok.token_to_id(self.pad_token) if self.pad_token else None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._special = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        self._special_ids = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}

    @functools.cached_property
    def max_chars_per_token(self) -> int:
        """The most characters one token can stand for, computed as vLLM does: the longest vocabulary entry,
        added tokens included. A byte-level entry spells one byte per character (`Ġthe`), so it counts the
        bytes of what it covers, never fewer than the characters. The server bounds a prompt's characters
        with it before tokenizing: more than `max_model_len * max_chars_per_token` cannot fit."""
        return max(len(t) for t in self._tok.get_vocab(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_with_offsets(self, text: str, add_special_tokens: bool = True) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and each token's (start, end) character span in `text`."""
        enc = self._tok.encode(text, add_special_tokens=add_special_tokens)
        return enc.ids, [tuple(o) for o in enc.offsets]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kw: Any) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template (no chat_template.jinja, no chat_template in "
                             "tokenizer_config.json); give one with --chat-template")
        import jinja2.ext
        import jinja2.sandbox  # lazy: only chat needs it

        # the environment transformers renders templates in (loop controls, tojson without ASCII escapes)
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                           extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
            x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)

        def raise_exception(msg: str) -> None:
            raise ValueError(f"chat template error: {msg}")

        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kw,
        )


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding everything.

    Byte-level BPE can split one character across tokens; decoding a window that starts a
    few tokens back (`prefix`) and emitting only what is new beyond `read` avoids emitting
    half a character (shown as U+FFFD) and keeps per-step cost O(window).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-6:])  # a little prompt context for spacing
        self.prefix = 0
        self.read = len(self.ids)
        self.text = ""  # generated text so far

    def add(self, new_ids: list[int]) -> str:
        out = []
        for t in new_ids:
            self.ids.append(t)
            before = self.tok.decode(self.ids[self.prefix:self.read], self.skip)
            after = self.tok.decode(self.ids[self.prefix:], self.skip)
            if after.endswith("\ufffd") or len(after) <= len(before):
                continue  # incomplete character (or nothing visible): wait for more tokens
            out.append(after[len(before):])
            self.prefix, self.read = self.read, len(self.ids)
        delta = "".join(out)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a request: emit what was held back, even an incomplete character."""
        before = self.tok.decode(self.ids[self.prefix:self.read], self.skip)
        after = self.tok.decode(self.ids[self.prefix:], self.skip)
        delta = after[len(before):] if after.startswith(before) else ""
        self.prefix = self.read = len(self.ids)
        self.text += delta
        return delta
