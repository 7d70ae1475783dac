"""Workloads: the token-exact requests every engine in a comparison receives.

Invariants: a workload is a pure function of (config, tokenizer.json): the same seed
gives the same prompt token ids, so every engine gets identical prompts. Random prompts
never contain special-token ids. Each item fits the model's context (prompt + output
<= max_position_embeddings). Multi-turn items name the turn they follow (`after`): turn
k's prompt is turn k-1's prompt + a fixed synthetic answer + new user tokens, so later
turns extend earlier ones token for token, independent of what any engine generated.
Real-text kinds (chat, summarize, multi_turn_chat, code: experiments/workload/realtext.py) are text from the
standard library, templated with the model's own chat template and tokenized here; with
`template = "engine"` their items also carry the messages, for each engine's chat route.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from experiments.workload.config import REAL_TEXT, IntOrRange, Workload


@dataclass
class WorkItem:
    request_id: str
    prompt_token_ids: list[int]
    output_len: int
    after: str | None = None  # multi-turn: the request that must finish before this one is sent
    # workload.template = "engine": the chat messages, sent to an engine's own chat route instead of the ids
    messages: list[dict[str, str]] | None = None


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"no tokenizer.json in model directory {model_dir}")
    return Tokenizer.from_file(str(path))


def context_len(model_dir: str | Path) -> int | None:
    cfg = Path(model_dir) / "config.json"
    return json.loads(cfg.read_text()).get("max_position_embeddings") if cfg.is_file() else None


def normal_ids(tok: Tokenizer) -> np.ndarray:
    """Token ids that are safe to put in random prompts: everything but special tokens."""
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    return np.array([i for i in range(tok.get_vocab_size(with_added_tokens=True)) if i not in special])


def _len(rng: np.random.Generator, spec: IntOrRange) -> int:
    return spec if isinstance(spec, int) else int(rng.integers(spec[0], spec[1] + 1))


def _tokens(rng: np.random.Generator, pool: np.ndarray, n: int) -> list[int]:
    return [int(x) for x in rng.choice(pool, size=n)]


def random_items(tok: Tokenizer, w: Workload, n: int, seed: int, prefix: str = "r") -> list[WorkItem]:
    rng, pool = np.random.default_rng(seed), normal_ids(tok)
    out = []
    for i in range(n):
        ilen, olen = _len(rng, w.input_len), _len(rng, w.output_len)
        out.append(WorkItem(f"{prefix}{i:04d}", _tokens(rng, pool, ilen), olen))
    return out


def shared_prefix_items(tok: Tokenizer, w: Workload) -> list[WorkItem]:
    """num_prefixes groups; request i uses prefix i % num_prefixes, then its own suffix."""
    rng, pool = np.random.default_rng(w.seed), normal_ids(tok)
    prefixes = [_tokens(rng, pool, w.prefix_len) for _ in range(w.num_prefixes)]
    out = []
    for i in range(w.num_requests):
        g = i % w.num_prefixes
        ilen, olen = _len(rng, w.input_len), _len(rng, w.output_len)
        out.append(WorkItem(f"g{g:02d}-r{i:04d}", prefixes[g] + _tokens(rng, pool, ilen), olen))
    return out


def multi_turn_items(tok: Tokenizer, w: Workload) -> list[WorkItem]:
    rng, pool = np.random.default_rng(w.seed), normal_ids(tok)
    out = []
    for c in range(w.num_requests):
        history: list[int] = []
        prev = None
        for t in range(w.turns):
            prompt = history + _tokens(rng, pool, _len(rng, w.input_len))
            olen = _len(rng, w.output_len)
            rid = f"c{c:03d}-t{t}"
            out.append(WorkItem(rid, prompt, olen, after=prev))
            # the synthetic answer keeps turn t+1 identical for every engine
            history, prev = prompt + _tokens(rng, pool, olen), rid
    return out


def repetitive_items(tok: Tokenizer, w: Workload) -> list[WorkItem]:
    """Code-editing-like prompts: a passage of `period` tokens repeated up to input_len, each
    copy with a few tokens changed (`edit_rate`), as when a model is asked to rewrite a file.
    What prompt-lookup (n-gram) speculation is for: the continuation is often in the context."""
    rng, pool = np.random.default_rng(w.seed), normal_ids(tok)
    out = []
    for i in range(w.num_requests):
        base = _tokens(rng, pool, w.period)
        ilen, olen = _len(rng, w.input_len), _len(rng, w.output_len)
        ids: list[int] = []
        while len(ids) < ilen:
            copy = list(base)
            for j in np.nonzero(rng.random(len(copy)) < w.edit_rate)[0]:
                copy[j] = int(rng.choice(pool))
            ids += copy
        out.append(WorkItem(f"e{i:04d}", ids[:ilen], olen))
    return out


def sharegpt_items(tok: Tokenizer, w: Workload) -> list[WorkItem]:
    """First human turn -> prompt; the gpt answer's length -> output length (unless fixed_output)."""
    try:
        data = json.loads(Path(w.path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read ShareGPT file {w.path!r}: {e}") from None
    if not isinstance(data, list):
        raise ValueError(f"ShareGPT file {w.path!r} must hold a JSON list of conversations")
    rng = np.random.default_rng(w.seed)
    usable = []
    for conv in data:
        turns = conv.get("conversations", []) if isinstance(conv, dict) else []
        if len(turns) < 2 or turns[0].get("from") != "human":
            continue
        prompt = tok.encode(turns[0]["value"]).ids
        answer = len(tok.encode(turns[1]["value"], add_special_tokens=False).ids)
        if 1 <= len(prompt) <= w.max_input_len and answer >= 1:
            usable.append((str(conv.get("id", len(usable))), prompt, answer))
    if len(usable) < w.num_requests:
        raise ValueError(f"ShareGPT file {w.path!r} has {len(usable)} usable conversations, "
                         f"workload.num_requests = {w.num_requests}")
    picks = rng.permutation(len(usable))[: w.num_requests]
    out = []
    for i, k in enumerate(picks):
        _, prompt, answer = usable[k]
        olen = _len(rng, w.output_len) if w.fixed_output else answer
        out.append(WorkItem(f"s{i:04d}", prompt, olen))
    return out


def real_text_items(model_dir: str | Path, tok: Tokenizer, w: Workload) -> list[WorkItem]:
    """The real-text kinds (experiments/workload/realtext.py), as token ids of the templated (or raw) text."""
    from experiments.workload import realtext

    rng = np.random.default_rng(w.seed)
    made = {"chat": lambda: realtext.chat(rng, w), "summarize": lambda: realtext.summarize(rng, w, tok),
            "multi_turn_chat": lambda: realtext.multi_turn_chat(rng, w, tok),
            "code": lambda: realtext.code(rng, w, tok)}[w.kind]()
    render = None
    if w.template != "none":
        from reference_engine.tokenizer.tokenizer import (
            Tokenizer as ChatTokenizer,  # the template code `inferlab serve` runs
        )

        chat_tok = ChatTokenizer(model_dir)
        if not chat_tok.chat_template:
            raise ValueError(f"workload.template = {w.template!r}: model {model_dir} has no chat template "
                             f"(no chat_template.jinja or tokenizer_config.json chat_template); "
                             f"use template = \"none\" for raw text")
        render = chat_tok.apply_chat_template
    out = []
    for rid, messages, olen, after in made:
        if render is None:
            ids = tok.encode(realtext.raw_text(w.kind, messages)).ids
        else:  # the template places any BOS itself, as transformers' apply_chat_template(tokenize=True)
            ids = tok.encode(render(messages, add_generation_prompt=True), add_special_tokens=False).ids
        out.append(WorkItem(rid, ids, olen, after, [dict(m) for m in messages] if w.template == "engine" else None))
    return out


def describe(items: list[WorkItem], w: Workload) -> dict[str, object]:
    """The workload's manifest (workload.json in the run folder): kind, template, seed, the prompt and
    max-output length distributions in the model's tokens, and for real text its sources."""
    from experiments.workload import realtext

    out: dict[str, object] = {"kind": w.kind, "seed": w.seed, "requests": len(items),
                              "template": w.template if w.kind in REAL_TEXT else None,
                              "prompt_tokens": realtext.stats([len(i.prompt_token_ids) for i in items]),
                              "max_output_tokens": realtext.stats([i.output_len for i in items])}
    if w.kind in REAL_TEXT:
        out["sources"] = realtext.sources(w.kind)
    return out


def build(model_dir: str | Path, w: Workload, warmup: int) -> tuple[list[WorkItem], list[WorkItem]]:
    """(measured items, warm-up items). Warm-up prompts are random and share nothing with
    the measured ones, so they warm kernels but not the prefix cache."""
    tok = load_tokenizer(model_dir)
    kinds = {"random": lambda: random_items(tok, w, w.num_requests, w.seed),
             "shared_prefix": lambda: shared_prefix_items(tok, w),
             "multi_turn": lambda: multi_turn_items(tok, w),
             "sharegpt": lambda: sharegpt_items(tok, w),
             "repetitive": lambda: repetitive_items(tok, w)}
    items = real_text_items(model_dir, tok, w) if w.kind in REAL_TEXT else kinds[w.kind]()
    warm = random_items(tok, w, warmup, w.seed + 1_000_003, prefix="warmup-")
    limit = context_len(model_dir)
    if limit:
        for it in items + warm:
            if len(it.prompt_token_ids) + it.output_len > limit:
                raise ValueError(f"request {it.request_id}: prompt {len(it.prompt_token_ids)} + output "
                                 f"{it.output_len} tokens exceeds the model's context of {limit}")
    return items, warm
