"""Per-row streaming out of one static `model.generate()` batch (used by `adapters/engines/hf/adapter.py`).

`generate()` runs in a worker thread. `RowStreamer` turns each step's `(B,)` token
tensor into one TokenEvent per live row, stamped once per step, and hands the whole
step to the event loop with a single `call_soon_threadsafe`; `RowsDone` tells
`generate()` which rows are finished so that a batch whose rows are all done (by
their own `max_tokens`, or aborted) stops early instead of running to the longest.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable

from adapters.base import GenerationRequest, TokenEvent


@dataclass
class Row:
    """One request in the HF engine: queued, then a row of a batch. `closed` (set only on
    the event loop) means its final event was delivered; `aborted` is read by the worker."""

    request: GenerationRequest
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    aborted: bool = False
    closed: bool = False
    n_out: int = 0  # tokens streamed so far (worker thread only)
    done: bool = False  # worker-side: no more tokens for this row


def make_classes():
    """Build the transformers subclasses lazily (transformers is an optional dependency)."""
    import torch
    from transformers import StoppingCriteria
    from transformers.generation.streamers import BaseStreamer

    class RowStreamer(BaseStreamer):
        def __init__(self, rows: list[Row], eos: set[int], ignore_eos: bool,
                     loop: asyncio.AbstractEventLoop, deliver: Callable[[list[tuple[Row, TokenEvent]]], None]):
            self.rows, self.eos, self.ignore_eos = rows, eos, ignore_eos
            self.loop, self.deliver = loop, deliver
            self.saw_prompt = False

        def put(self, value) -> None:
            recv_ns = time.perf_counter_ns()
            if not self.saw_prompt:  # generate() first puts the prompt ids (B, T)
                self.saw_prompt = True
                return
            tokens = value.reshape(-1).tolist()  # (B,) or (B, 1) -> B ints
            out = []
            for row, tok in zip(self.rows, tokens):
                if row.done:
                    continue  # finished rows get pad tokens from generate()
                row.n_out += 1
                reason = None
                if tok in self.eos and not self.ignore_eos:
                    reason = "stop"
                elif row.n_out >= row.request.sampling.max_tokens:
                    reason = "length"
                if reason is None:
                    out.append((row, TokenEvent(row.request.request_id, [tok], "", recv_ns)))
                else:
                    row.done = True
                    out.append((row, _final(row, [tok], reason, recv_ns)))
            if out:
                self.loop.call_soon_threadsafe(self.deliver, out)

        def end(self) -> None:
            # generate() returned: any row still open ran out of steps (only possible if
            # generate stopped on its own, e.g. max_length), so it ends with "length".
            recv_ns = time.perf_counter_ns()
            out = [(r, _final(r, [], "length", recv_ns)) for r in self.rows if not r.done]
            for r in self.rows:
                r.done = True
            if out:
                self.loop.call_soon_threadsafe(self.deliver, out)

    class RowsDone(StoppingCriteria):
        """Row i is done once it produced its own max_tokens or was aborted."""

        def __init__(self, rows: list[Row], prompt_len: int):
            self.rows, self.prompt_len = rows, prompt_len

        def __call__(self, input_ids, scores, **kwargs):
            n = input_ids.shape[1] - self.prompt_len  # tokens generated so far, incl. this step's
            done = [r.aborted or n >= r.request.sampling.max_tokens for r in self.rows]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return RowStreamer, RowsDone


def _final(row: Row, ids: list[int], reason: str, recv_ns: int) -> TokenEvent:
    return TokenEvent(row.request.request_id, ids, "", recv_ns, True, reason,
                      len(row.request.prompt_token_ids), row.n_out)
