"""Lab 13 — speculative decoding: guess k tokens cheaply, verify them in one target pass.

Smallest working pieces: `find_ngram` (prompt lookup: propose what followed the last time the context's
tail appeared), `greedy_verify` (keep drafts while they equal the target's argmax, then add the target's
own token) and `rejection_sample` (the sampling rule that keeps the target's distribution exact).
Then the engine with n-gram speculation through `inferlab trace`'s runner.

    python docs/handbook/labs/13_speculative.py [--model DIR] [--real-model DIR]
"""
import argparse

import torch

from reference_engine.spec_decode.ngram import find_ngram
from reference_engine.spec_decode.rejection_sampler import greedy_verify, rejection_sample
from reference_engine.engine.trace import parse, resolve_model, run_trace

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
ap.add_argument("--real-model", help="a real model directory (default: models/smollm2-135m-instruct, made if absent)")
args = ap.parse_args()

ctx = [1, 2, 3, 4, 9, 9, 1, 2, 3]
print(f"context {ctx}: tail [1, 2, 3] appeared at 0, followed by {find_ngram(ctx, 1, 3, 3)} -> the drafts")


def verified(target: list[int], drafts: list[int], emitted: list[int]) -> str:
    """What one verification pass did, read from what `greedy_verify` returned (never assumed)."""
    accepted = len(emitted) - 1
    assert emitted[:accepted] == drafts[:accepted] and accepted <= len(drafts)
    s = "s" * (accepted != 1)
    return (f"target argmax at the 1 + {len(drafts)} rows {target} -> emit {emitted} ({accepted} draft{s} "
            f"accepted, then the target's own token: {len(emitted)} token{'s' * (len(emitted) != 1)} from one pass)")


print(verified([4, 9, 7, 5], [4, 9, 9], greedy_verify([4, 9, 7, 5], [4, 9, 9])))

# Sampling: a point-mass draft d is accepted with probability p(d); on rejection the token comes from p
# with d removed. The emitted token is then distributed exactly as p.
p = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2]])  # target rows for draft position 1 and the bonus row
g = torch.Generator().manual_seed(0)
first = [rejection_sample(p, [0], None, g)[0] for _ in range(4000)]
freq = torch.bincount(torch.tensor(first), minlength=3) / 4000
print(f"draft token 0, target p = {[round(x, 3) for x in p[0].tolist()]}: "
      f"emitted-token frequencies {[round(x, 3) for x in freq.tolist()]}")
assert (freq - p[0]).abs().max() < 0.03

targs = parse(["one two three one two three one two three one two three", "--speculative", "ngram",
               "--max-tokens", "24"])
targs.model = resolve_model(args.model)
doc = run_trace(targs)
for s in doc["steps"]:
    for rid, sp in s["speculative"].items():
        print(f"step {s['step']}: request {rid} proposed {sp['proposed']} accepted {sp['accepted']} -> "
              f"{len(s['tokens'].get(rid, []))} tokens this step")
sm = doc["summary"]
print(f"{sm['steps']} steps for 24 tokens; drafts verified {sm['spec_draft_tokens']}, "
      f"accepted {sm['spec_accepted_tokens']}")

# Real text on the real model: prompt lookup helps where the answer quotes the prompt, little elsewhere.
from reference_engine.config import EngineConfig  # noqa: E402
from reference_engine.engine.llm_engine import LLMEngine  # noqa: E402
from reference_engine.sampling_params import SamplingParams  # noqa: E402
from reference_engine.engine.trace import resolve_real_model  # noqa: E402

real = resolve_real_model(args.real_model)
ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
QUESTIONS = {
    "quotes its prompt": "Repeat this sentence exactly: The cache stores the keys and values of every earlier "
                         "token, so a decode step reads them instead of computing them again.",
    "free answer": "Name three uses of a hash table.",
}
for kind, question in QUESTIONS.items():
    eng = LLMEngine(EngineConfig(model=real, speculative_config=ngram, kv_cache_tokens=1024))
    tok = eng.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": question}]), add_special_tokens=False)
    eng.add_request(ids, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True), request_id="q")
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
    st = eng.stats()
    rate = st.spec_decode_num_accepted_tokens / max(st.spec_decode_num_draft_tokens, 1)
    print(f"real text, {kind} (SmolLM2-135M-Instruct, n-gram k=3): 24 tokens in {steps} steps; drafts verified "
          f"{st.spec_decode_num_draft_tokens}, accepted {st.spec_decode_num_accepted_tokens} ({rate:.0%})")
