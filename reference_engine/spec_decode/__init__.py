"""Speculative decoding: cheap proposals, verified k at a time by one target forward pass.

One file per stage:
- `proposer.py`: the `Proposer` interface and its registry (`speculative_config.method`);
- `ngram.py`: prompt lookup, no extra model;
- `draft.py`: a smaller draft model with its own KV tensors over the target's block ids;
- `rejection_sampler.py`: exact verification, as pure functions;
- `verifier.py`: the glue the model runner calls (target rows -> accepted tokens per request).

Runs inside the model runner. Owns: proposals and their verification (a draft model's own KV
tensors, over the block ids the scheduler gave the target). Never touches: the scheduler, the
KV-cache manager or the block pool; rejected drafts are rolled back by the scheduler's manager
(`core/kv_cache_manager.rollback`) after the step. See docs/architecture.md.
"""
from reference_engine.spec_decode.proposer import PROPOSERS, Draft, Proposer, make_proposer

__all__ = ["PROPOSERS", "Draft", "Proposer", "make_proposer"]
