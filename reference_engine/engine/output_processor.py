"""Output processing: stop checks, incremental detokenization, and the deltas users see.

A step may bring several tokens for a request (accepted draft tokens + one from the target).
They are appended one at a time, and every stop rule is checked after each, exactly as if
they had come one per step: a stop inside the run keeps the tokens up to it and drops the rest.

Stop rules, checked after every new token (vLLM v1's meanings, `v1/engine/detokenizer.py`):
- an EOS id (unless `ignore_eos`)          -> finish_reason "stop", stop_reason None
- a token in `stop_token_ids`             -> "stop", stop_reason = that id
- `max_tokens` reached or context full    -> "length"
- a stop string ends in the new text      -> "stop", stop_reason = the string (even after "length"),
                                             text cut before it (after it with include_stop_str_in_output)
A token that stops the request (EOS or a stop id) is not detokenized: its text is not in the
output, unless include_stop_str_in_output. min_tokens: the sampler bans EOS and the stop ids
until then, and a stop string counts only if it ends after the min_tokens-th token's text.
When stop strings are excluded, the last (longest stop - 1) characters are held back from
the stream until we know they do not start a stop string, so streamed text never contains one.
"""
from __future__ import annotations

from dataclasses import dataclass

from reference_engine.outputs import CompletionOutput, TokenDelta, TokenLogprob
from reference_engine.core.request import Request
from reference_engine.tokenizer.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class _State:
    detok: IncrementalDetokenizer
    emitted: int = 0  # characters of text already streamed
    text: str | None = None  # final text once cut at a stop string
    logprobs: list[TokenLogprob] | None = None
    hold: int = 0


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, eos_ids: set[int], max_model_len: int, keep_results: bool = False):
        self.tok = tokenizer
        self.eos_ids = eos_ids
        self.max_model_len = max_model_len
        self.keep_results = keep_results
        self.states: dict[str, _State] = {}
        self.results: dict[str, CompletionOutput] = {}

    def add(self, req: Request) -> None:
        p = req.params
        self.states[req.request_id] = _State(
            IncrementalDetokenizer(self.tok, req.prompt_token_ids, p.skip_special_tokens),
            logprobs=[] if p.logprobs is not None else None,
            hold=0 if p.include_stop_str_in_output else max((len(s) for s in p.stop), default=1) - 1,
        )

    def process(self, req: Request, tokens: list[int] | None, lps: list[TokenLogprob] | None) -> TokenDelta:
        """Append a step's new tokens (None or []: the request was aborted) and build its delta."""
        st = self.states[req.request_id]
        new: list[int] = []
        for i, token in enumerate(tokens or ()):
            req.output_token_ids.append(token)
            new.append(token)
            if st.logprobs is not None and lps is not None:
                st.logprobs.append(lps[i])
            self._check_token_stops(req, token)
            before = len(st.detok.text)
            if req.finish_reason != "stop" or req.params.include_stop_str_in_output:
                st.detok.add([token])  # a stopping token's text is not output (vLLM)
            self._check_stop_strings(req, st, before)
            if req.is_finished:
                break  # a stop inside an accepted run: the rest is dropped
        # No flush at the end: an incomplete UTF-8 character still held back is dropped, as vLLM's
        # DecodeStream drops it (flushing would end the text with U+FFFD).
        full = st.text if st.text is not None else st.detok.text
        end = len(full) if req.is_finished else max(st.emitted, len(full) - st.hold)
        delta_text, st.emitted = full[st.emitted:end], end
        delta = TokenDelta(
            request_id=req.request_id, new_token_ids=new, text_delta=delta_text,
            finished=req.is_finished, finish_reason=req.finish_reason, stop_reason=req.stop_reason,
            logprobs=lps[:len(new)] if (lps is not None and st.logprobs is not None and new) else None,
            num_prompt_tokens=req.num_prompt_tokens, num_output_tokens=len(req.output_token_ids),
        )
        if req.is_finished:
            self.states.pop(req.request_id)
            if self.keep_results:
                self.results[req.request_id] = CompletionOutput(
                    req.request_id, req.prompt_token_ids, list(req.output_token_ids), full,
                    req.finish_reason, req.stop_reason, st.logprobs, req.num_preemptions)
        return delta

    def _check_token_stops(self, req: Request, token: int) -> None:
        p = req.params
        if not p.ignore_eos and token in self.eos_ids:
            req.finish("stop")
        elif token in p.stop_token_ids:
            req.finish("stop", token)
        elif req.num_tokens_left <= 0 or req.num_tokens >= self.max_model_len:
            req.finish("length")

    def _check_stop_strings(self, req: Request, st: _State, before: int) -> None:
        """`before`: the text's length before this token. A match must end in the new text."""
        p = req.params
        if not p.stop or len(req.output_token_ids) <= p.min_tokens:
            return
        text = st.detok.text
        if len(text) == before:
            return
        hits = [(i + len(s), k, i, s) for k, s in enumerate(p.stop)
                if (i := text.find(s, max(0, before + 1 - len(s)))) >= 0]
        if hits:
            end, _, i, s = min(hits)  # the one that completes first (ties: list order, as vLLM)
            st.text = text[:end] if p.include_stop_str_in_output else text[:i]
            req.finish("stop", s)
