"""Turn cumulative streams (every event repeats everything so far) into deltas.

SGLang's /generate (without --incremental-streaming-output) and TensorRT-LLM's
`generate_async` stream the whole output each time; `TokenEvent` carries only the
new part. Invariant: the concatenation of the deltas equals the last cumulative
value, and a cumulative value that does not extend the previous one is an error
(never silently re-sent as new tokens).
"""
from __future__ import annotations


class NotCumulative(ValueError):
    """The stream was declared cumulative but a value did not extend the previous one."""


class Cumulative:
    """Feed the cumulative ids and text of each event; get back the new part."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.text = ""

    def feed(self, ids: list[int], text: str = "") -> tuple[list[int], str]:
        n, m = len(self.ids), len(self.text)
        if len(ids) < n or ids[:n] != self.ids:
            raise NotCumulative(f"cumulative ids went from {len(self.ids)} to {len(ids)} tokens and do not "
                                f"extend the previous value (is the server streaming incrementally?)")
        # Text may legitimately shrink by a replacement character when a multi-byte
        # character completes; only ids are strict.
        new_text = text[m:] if text.startswith(self.text) else text
        self.ids, self.text = list(ids), text
        return list(ids[n:]), new_text


class Incremental:
    """The same interface for streams that already send deltas (ids and text pass through)."""

    def __init__(self) -> None:
        self.ids: list[int] = []

    def feed(self, ids: list[int], text: str = "") -> tuple[list[int], str]:
        self.ids.extend(ids)
        return list(ids), text
