"""Real-text workloads that ship with the project: built from text every Python installation carries,
no network. English prose is the standard library's `pydoc_data.topics` (the language reference's
help pages); code is the standard library's own top-level `.py` modules.

Kinds (`[workload] kind`):
- `chat`: short questions about real sentences of the prose (input_len is not used).
- `summarize`: one shared system prompt + "summarise this document" over a passage of about
  input_len tokens (whole lines, so the body stops at the first line that reaches it).
- `multi_turn_chat`: num_requests conversations of `turns` turns; each turn adds a question, and
  the answer put in the history is a prose passage of about output_len tokens (fixed, so turn k+1
  is the same for every engine whatever each one generated); the context grows turn by turn.
- `code`: a stdlib module from a `def`/`class` line on, about input_len tokens, to be continued.

`template` (see experiments.workload.config.Workload): "harness" renders the model's own chat template (as
transformers' apply_chat_template with add_generation_prompt, through the same code as `inferlab
serve`) and tokenizes once, so every engine gets the same ids; "engine" also keeps the messages, sent
to each engine's chat route; "none" tokenizes the raw text (code: the code alone).

Determinism: the same seed gives the same token ids on any machine with the same Python version.
The standard library's text differs between Python versions (and patch releases), so the ids do too:
`describe()` records the Python version and the sources in the run's workload.json.
"""
from __future__ import annotations

import platform
import re
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

SUMMARY_SYSTEM = ("You are a careful technical writer. Summarise the document the user gives you in "
                  "three to five plain sentences, keeping its key terms.")
SUMMARY_ASK = "Summarise this document.\n\n"
CODE_ASK = "Continue this Python code from where it stops. Reply with code only.\n\n"
QUESTIONS = ("What does this mean: \"{s}\"",
             "Can you explain this in simpler words? {s}",
             "Give a short example that illustrates this: {s}",
             "Is this true, and why? {s}",
             "Rephrase this for a beginner: {s}")
TOPIC_QUESTIONS = ("What is {t} in Python?", "How do I use {t} in Python?", "Explain {t} briefly.")
Messages = list[dict[str, str]]
DEF = re.compile(r"^\s*(def|class|async def) ")


@lru_cache(maxsize=1)
def prose() -> tuple[tuple[str, str], ...]:
    """(topic, text) of pydoc_data.topics, sorted by topic."""
    from pydoc_data.topics import topics

    return tuple((k, topics[k]) for k in sorted(topics))


@lru_cache(maxsize=1)
def code_files() -> tuple[Path, ...]:
    """The standard library's top-level modules, sorted by name (no tests, no site-packages)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return tuple(sorted((p for p in stdlib.glob("*.py") if p.is_file()), key=lambda p: p.name))


@lru_cache(maxsize=1)
def sentences() -> tuple[str, ...]:
    """Plain sentences of 8-30 words from the prose (no code lines, no reST markup left over)."""
    out = []
    for _, text in prose():
        for para in re.split(r"\n\s*\n", text):
            if para.startswith("   ") or "::" in para or "|" in para or "*" in para:
                continue  # indented examples, grammar rules, tables
            flat = " ".join(para.split())
            for s in re.split(r"(?<=[.?!])\s+(?=[A-Z])", flat):
                if 8 <= len(s.split()) <= 30 and s.endswith(".") and "\"" not in s:
                    out.append(s)
    return tuple(out)


def questions(rng: np.random.Generator, n: int) -> list[str]:
    """`n` short chat questions: a real sentence in a question frame, or one about a help topic."""
    sents, topics = sentences(), [k for k, _ in prose()]
    out = []
    for _ in range(n):
        if rng.random() < 0.25:
            out.append(TOPIC_QUESTIONS[int(rng.integers(len(TOPIC_QUESTIONS)))].format(
                t=topics[int(rng.integers(len(topics)))].replace("-", " ")))
        else:
            out.append(QUESTIONS[int(rng.integers(len(QUESTIONS)))].format(s=sents[int(rng.integers(len(sents)))]))
    return out


class Passages:
    """Whole-line passages of about n tokens, counted with the model's tokenizer."""

    def __init__(self, tok: Tokenizer, docs: list[str]):
        self.tok = tok
        self.lines = [d.splitlines() for d in docs]
        self._counts: dict[int, list[int]] = {}

    def counts(self, d: int) -> list[int]:
        if d not in self._counts:  # a line's tokens, newline included (a close sum for the joined text)
            enc = self.tok.encode_batch([ln + "\n" for ln in self.lines[d]], add_special_tokens=False)
            self._counts[d] = [len(e.ids) for e in enc]
        return self._counts[d]

    def take(self, d: int, start: int, n: int, spill: bool = True) -> str:
        """Lines from line `start` of document `d` (then, with `spill`, the next documents) up to about
        n tokens."""
        out: list[str] = []
        total, visited = 0, 0
        while total < n and visited <= len(self.lines):  # the whole corpus at most (a huge n ends there)
            visited += 1
            lines, counts = self.lines[d], self.counts(d)
            for ln, c in zip(lines[start:], counts[start:]):
                out.append(ln)
                total += c
                if total >= n:
                    break
            d, start = (d + 1) % len(self.lines), 0
            if not spill:
                break
            if total < n:
                out.append("")  # a blank line between documents
        return "\n".join(out).strip("\n")

    def starts(self, d: int, pattern: str | re.Pattern[str]) -> list[int]:
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        return [i for i, ln in enumerate(self.lines[d]) if rx.match(ln)] or [0]

    def paragraphs(self, d: int) -> list[int]:
        """First lines of the prose paragraphs of document `d` (unindented, after a blank line)."""
        lines = self.lines[d]
        return [i for i, ln in enumerate(lines) if ln[:1].strip() and (i == 0 or not lines[i - 1].strip())] or [0]


def _n(rng: np.random.Generator, spec: Any) -> int:
    return spec if isinstance(spec, int) else int(rng.integers(spec[0], spec[1] + 1))


def chat(rng: np.random.Generator, w: Any) -> list[tuple[str, Messages, int, str | None]]:
    return [(f"q{i:04d}", [{"role": "user", "content": q}], _n(rng, w.output_len), None)
            for i, q in enumerate(questions(rng, w.num_requests))]


def summarize(rng: np.random.Generator, w: Any, tok: Tokenizer) -> list[tuple[str, Messages, int, str | None]]:
    docs = Passages(tok, [t for _, t in prose()])
    out = []
    for i in range(w.num_requests):
        d = int(rng.integers(len(docs.lines)))
        paras = docs.paragraphs(d)
        body = docs.take(d, paras[int(rng.integers(len(paras)))], _n(rng, w.input_len))
        out.append((f"d{i:04d}", [{"role": "system", "content": SUMMARY_SYSTEM},
                                  {"role": "user", "content": SUMMARY_ASK + body}], _n(rng, w.output_len), None))
    return out


def multi_turn_chat(rng: np.random.Generator, w: Any, tok: Tokenizer) -> list[tuple[str, Messages, int, str | None]]:
    docs = Passages(tok, [t for _, t in prose()])
    out = []
    for c in range(w.num_requests):
        history: Messages = []
        prev = None
        for t, q in enumerate(questions(rng, w.turns)):
            history = history + [{"role": "user", "content": q}]
            olen, rid = _n(rng, w.output_len), f"c{c:03d}-t{t}"
            out.append((rid, history, olen, prev))
            d = int(rng.integers(len(docs.lines)))
            paras = docs.paragraphs(d)
            # the answer in the history: real prose of about the turn's output length, the same for every engine
            answer = docs.take(d, paras[int(rng.integers(len(paras)))], olen)
            history, prev = history + [{"role": "assistant", "content": answer}], rid
    return out


def code(rng: np.random.Generator, w: Any, tok: Tokenizer) -> list[tuple[str, Messages, int, str | None]]:
    files = code_files()
    src = Passages(tok, [p.read_text(encoding="utf-8", errors="replace") for p in files])
    defs = {f: src.starts(f, DEF) for f in range(len(files))}
    usable = [f for f in range(len(files)) if DEF.match(src.lines[f][defs[f][0]])]  # modules with code
    out = []
    for i in range(w.num_requests):
        f, n = usable[int(rng.integers(len(usable)))], _n(rng, w.input_len)
        counts = src.counts(f)
        left = [k for k in defs[f] if sum(counts[k:]) >= n] or defs[f][:1]  # a start with n tokens after it
        snippet = src.take(f, left[int(rng.integers(len(left)))], n, spill=False)  # one module only
        out.append((f"k{i:04d}-{files[f].stem}", [{"role": "user", "content": CODE_ASK + snippet + "\n"}],
                    _n(rng, w.output_len), None))
    return out


def raw_text(kind: str, messages: Messages) -> str:
    """template = "none": the text itself (code without the instruction; turns joined by blank lines)."""
    if kind == "code":
        return messages[-1]["content"].removeprefix(CODE_ASK)
    return "\n\n".join(m["content"] for m in messages)


def sources(kind: str) -> dict[str, Any]:
    """Where the text came from, for the manifest: text differs between Python versions."""
    out: dict[str, Any] = {"python": platform.python_version(), "implementation": platform.python_implementation()}
    if kind == "code":
        out.update(text="stdlib top-level modules", stdlib=sysconfig.get_paths()["stdlib"], files=len(code_files()))
    else:
        out.update(text="pydoc_data.topics", topics=len(prose()))
    return out


def stats(values: list[int]) -> dict[str, float]:
    """min / median / p90 / max / mean of token lengths."""
    if not values:
        return {}
    a = np.asarray(values)
    return {"n": len(values), "min": int(a.min()), "median": float(np.median(a)),
            "p90": float(np.percentile(a, 90)), "max": int(a.max()), "mean": float(a.mean())}
