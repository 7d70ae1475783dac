"""N-gram prompt lookup: guess that the text continues as it did after the last time its
tail appeared (vLLM's `ngram` method; no extra model, no KV).

For n from `prompt_lookup_max` down to `prompt_lookup_min`: find the first earlier
occurrence of the context's last n tokens and propose the (up to k) tokens that followed
it. Cost: O(context * n) vectorised compares per request per step.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from reference_engine.spec_decode.proposer import Draft, Proposer


def find_ngram(context: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The tokens that followed the first earlier match of the longest suffix n-gram, at most k."""
    arr = np.asarray(context, dtype=np.int64)
    size = len(arr)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        # windows of arr[:-1] start at 0 .. size-1-n: every earlier n-gram, never the suffix itself
        hits = np.flatnonzero((sliding_window_view(arr[:-1], n) == arr[size - n:]).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return arr[start:start + k].tolist()
    return []


class NgramProposer(Proposer):
    def propose(self, reqs, block_tables, new_tokens, num_drafts, default_gen):
        lo, hi = self.spec.prompt_lookup_min, self.spec.prompt_lookup_max
        return [Draft(find_ngram(r.token_ids + new, lo, hi, k) if k > 0 else [])
                for r, new, k in zip(reqs, new_tokens, num_drafts)]
