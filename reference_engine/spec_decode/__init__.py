"""Speculative decoding: cheap proposals, verified k at a time by one target forward pass.

One file per stage:
- `proposer.py`: the `Proposer` interface and its registry (`speculative_config.method`);
- `ngram.py`: prompt lookup, no extra model;
- `draft.py`: a smaller draft model with its own KV tensors over the target's block ids;
- `rejection_sampler.py`: exact verification, as pure functions;
- `verifier.py`: the glue the model runner calls (target rows -> accepted tokens per request).
"""
from reference_engine.spec_decode.proposer import PROPOSERS, Draft, Proposer, make_proposer

__all__ = ["PROPOSERS", "Draft", "Proposer", "make_proposer"]
