"""What the soak sends: a seeded, shuffled deck of request kinds, so every 40 arrivals hold exactly
the same mix (10 % of the streams cut, 5 % invalid requests), whatever the run's length.

`plan(n, seed)` lays out one period of the load (load.py replays it every period): each arrival's
`Slot`, its kind and the seed of its shape (sampled or greedy, where a stream is cut, which long
passage and ask, n-best and sampling seeds, whether a multi-turn request continues a conversation).
`make(slot)` builds the request: the shape from the slot's seed, the question text fresh from the
mix's own stream. So every period holds the same kinds, at the same offsets, with the same shapes
(the latency windows compare like with like), while the text never repeats.

| kind | share | what |
|---|---|---|
| chat | 18/40 | one real question (experiments.workload.realtext), <= 64 tokens; a quarter sampled (seeded) |
| multi | 12/40 | a conversation's next turn: its history (the answers it got) + a question; turns share a prefix |
| cut | 4/40 | a chat stream the client closes after 1-6 token events |
| long | 2/40 | one of six prose passages + a question, filling the context: prompt + max_tokens = max_model_len |
| invalid | 2/40 | a request the server must refuse with a 4xx (`invalid_requests`, each in turn) |
| nbest | 1/40 | n = 2, sampled |
| logprobs | 1/40 | logprobs with top_logprobs = 3 |

Every valid request streams with `return_token_ids` (the delta ids per chunk) and usage. `warmup()` sends the long
passages once before anything is measured. The probe set (`probe_requests`) is fixed text, greedy,
non-streamed: its token ids are compared at start and end.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from experiments.workload import realtext
from experiments.workload.workloads import load_tokenizer

DECK = {"chat": 18, "multi": 12, "cut": 4, "long": 2, "invalid": 2, "nbest": 1, "logprobs": 1}
STREAMING = ("chat", "multi", "cut", "long", "nbest", "logprobs")
INTERACTIVE = ("chat", "multi")  # the kinds the SLO search judges and the latency verdict reads
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
LONG_ASKS = ("Summarise the document above.", "List three key terms of the document above.",
             "What is the document above about?")
LONG_DOCS, LONG_ROOM = 6, 48  # passages in the long pool; tokens left for the answer
MAX_TURNS = 6
PROBES = ("What is a Python list?", "Explain recursion in one sentence.", "Write a haiku about the sea.",
          "What is 12 times 7?")


def invalid_requests(model: str, max_model_len: int) -> list[tuple[str, str, bytes]]:
    """(name, path, raw body): each must get a 4xx, never a 5xx nor a 2xx."""
    msg = [{"role": "user", "content": "hello"}]

    def body(path: str = CHAT, **kw) -> bytes:
        return json.dumps(({"model": model, "messages": msg} if path == CHAT else {"model": model}) | kw).encode()

    return [
        ("bad-json", CHAT, b'{"model": "x", "messages": [{"role": "user", "content": "hi"}'),
        ("unknown-model", CHAT, body(model="no-such-model")),
        ("negative-max-tokens", CHAT, body(max_tokens=-5)),
        ("empty-messages", CHAT, body(messages=[])),
        ("negative-temperature", CHAT, body(temperature=-1.0)),
        ("n-zero", CHAT, body(n=0)),
        ("top-p-above-1", CHAT, body(top_p=2.0)),
        ("content-not-text", CHAT, body(messages=[{"role": "user", "content": 42}])),
        ("prompt-over-context", COMPLETIONS, body(COMPLETIONS, prompt=[100] * (max_model_len + 8), max_tokens=4)),
        ("logit-bias", CHAT, body(logit_bias={"100": 1.0})),
        ("empty-prompt", COMPLETIONS, body(COMPLETIONS, prompt="")),
        ("tgi-bad-parameter", "/generate",
         json.dumps({"inputs": "hi", "parameters": {"max_new_tokens": "x"}}).encode()),
    ]


@dataclass(frozen=True)
class Slot:
    """One arrival of a period: its kind, and the seed its shape is drawn from."""
    kind: str
    seed: int


def plan(n: int, seed: int) -> list[Slot]:
    """`n` arrivals' slots: kinds from seeded shuffled decks (exact shares in every 40), each with its
    own shape seed. The same (n, seed) gives the same plan."""
    rng, kinds = np.random.default_rng(seed), []
    while len(kinds) < n:
        deck = [k for k, c in DECK.items() for _ in range(c)]
        rng.shuffle(deck)
        kinds += deck
    return [Slot(k, int(s)) for k, s in zip(kinds[:n], rng.integers(1 << 31, size=n))]


@dataclass
class Conversation:
    messages: list[dict[str, str]] = field(default_factory=list)
    turns: int = 0


@dataclass
class Req:
    kind: str
    path: str = CHAT
    body: dict | None = None
    raw: bytes | None = None  # invalid requests go out as these bytes
    name: str = ""  # the invalid request's name
    cut_after: int | None = None  # token events before the client closes the stream
    conv: Conversation | None = None
    question: str = ""


class Mix:
    """`make(slot)` -> the slot's Req (slots: `plan`); `done(req, text)` after a multi-turn answer
    (None: the turn failed)."""

    def __init__(self, model_dir: str | Path, served: str, max_model_len: int, seed: int = 0):
        from reference_engine.tokenizer.tokenizer import Tokenizer as ChatTokenizer  # the template code the server runs

        self.served, self.max_len = served, max_model_len
        self.rng = np.random.default_rng(seed)
        self.chat_tok, self.deck, self.inv = ChatTokenizer(model_dir), [], -1
        self.idle: list[Conversation] = []
        self.invalid = invalid_requests(served, max_model_len)
        self.long = self._long_pool(load_tokenizer(model_dir))

    def prompt_len(self, messages: list[dict[str, str]]) -> int:
        text = self.chat_tok.apply_chat_template(messages, add_generation_prompt=True)
        return len(self.chat_tok.encode(text, add_special_tokens=False))

    def _long_pool(self, tok) -> list[str]:
        """Passages whose longest ask fills the context but LONG_ROOM tokens (whole lines dropped to fit)."""
        docs, out = realtext.Passages(tok, [t for _, t in realtext.prose()]), []
        target = self.max_len - LONG_ROOM
        while len(out) < LONG_DOCS:
            d = int(self.rng.integers(len(docs.lines)))
            paras = docs.paragraphs(d)
            lines = docs.take(d, paras[int(self.rng.integers(len(paras)))], target).splitlines()
            while lines and max(self.prompt_len(self._long_msgs("\n".join(lines), a)) for a in LONG_ASKS) > target:
                lines.pop()
            if len(lines) > 1:
                out.append("\n".join(lines))
        return out

    @staticmethod
    def _long_msgs(doc: str, ask: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"{doc}\n\n{ask}"}]

    def _body(self, messages: list[dict[str, str]], max_tokens: int, **kw) -> dict:
        return {"model": self.served, "messages": messages, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}, "return_token_ids": True, "temperature": 0.0} | kw

    def _question(self) -> str:
        return realtext.questions(self.rng, 1)[0]

    def make(self, slot: Slot) -> Req:
        """The slot's request: its shape from `slot.seed`, its question fresh from the mix's stream."""
        kind, shape = slot.kind, np.random.default_rng(slot.seed)
        q = self._question()
        user = [{"role": "user", "content": q}]
        seed = int(shape.integers(1 << 31))
        if kind == "chat":
            extra = {"temperature": 0.7, "top_p": 0.95, "seed": seed} if shape.random() < 0.25 else {}
            return Req(kind, body=self._body(user, 64, **extra), question=q)
        if kind == "cut":
            return Req(kind, body=self._body(user, 64), cut_after=int(shape.integers(1, 7)), question=q)
        if kind == "nbest":
            return Req(kind, body=self._body(user, 32, n=2, temperature=0.8, seed=seed), question=q)
        if kind == "logprobs":
            return Req(kind, body=self._body(user, 32, logprobs=True, top_logprobs=3), question=q)
        if kind == "invalid":
            self.inv += 1  # in turn: every kind of refusal, equally often
            name, path, raw = self.invalid[self.inv % len(self.invalid)]
            return Req(kind, path=path, raw=raw, name=name)
        if kind == "long":
            doc, ask = self.long[int(shape.integers(len(self.long)))], LONG_ASKS[int(shape.integers(3))]
            msgs = self._long_msgs(doc, ask)
            return Req(kind, body=self._body(msgs, self.max_len - self.prompt_len(msgs)), question=ask)
        return self._turn(q, shape)

    def _turn(self, q: str, shape: np.random.Generator) -> Req:
        """The next turn of an idle conversation (3 in 4 times, when one waits), else a new one."""
        conv = None
        if self.idle and shape.random() < 0.75:
            conv = self.idle.pop(int(shape.integers(len(self.idle))))
        conv = conv or Conversation()
        msgs = conv.messages + [{"role": "user", "content": q}]
        room = self.max_len - self.prompt_len(msgs)
        if room < 64:  # the history filled the context: start over
            conv, msgs = Conversation(), [{"role": "user", "content": q}]
            room = self.max_len - self.prompt_len(msgs)
        return Req("multi", body=self._body(msgs, min(48, room)), conv=conv, question=q)

    def warmup(self) -> list[Req]:
        """Each long passage once (one token): its prefill, seconds on a CPU, happens here rather than at
        random inside a search level; later long requests find the passage in the prefix cache, unless
        the traffic since has evicted it."""
        return [Req("warmup", body=self._body(self._long_msgs(doc, LONG_ASKS[0]), 1)) for doc in self.long]

    def done(self, req: Req, text: str | None) -> None:
        conv = req.conv
        if conv is None or text is None:
            return
        conv.messages = conv.messages + [{"role": "user", "content": req.question},
                                         {"role": "assistant", "content": text}]
        conv.turns += 1
        if conv.turns < MAX_TURNS:
            self.idle.append(conv)
            del self.idle[:-16]  # at most 16 waiting conversations: the oldest are dropped


def probe_requests(served: str) -> list[tuple[str, dict]]:
    """(path, body) of the fixed greedy probes: four chat questions and one raw completion."""
    out = [(CHAT, {"model": served, "messages": [{"role": "user", "content": p}], "max_tokens": 32,
                   "temperature": 0.0, "return_token_ids": True}) for p in PROBES]
    out.append((COMPLETIONS, {"model": served, "prompt": "def fibonacci(n):", "max_tokens": 32, "temperature": 0.0,
                              "return_token_ids": True}))
    return out
