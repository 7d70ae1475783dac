"""Lab 10 — prefix caching: chain hashes of full blocks, and three requests sharing one prompt.

Smallest working piece: `hash_block(parent, tokens)`. Equal hashes mean equal *prefixes*, because each
block's hash includes its parent's. Then the real thing: `inferlab trace`'s engine run with three
requests that share a prompt, showing which blocks are reused and the hit counters.

    python docs/handbook/labs/10_prefix_cache.py [--model DIR]
"""
import argparse

from reference_engine.core.prefix_cache import ROOT, hash_block
from reference_engine.trace import parse, resolve_model, run_trace

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
args = ap.parse_args()
BS = 4


def chain(tokens):
    hs, parent = [], ROOT
    for i in range(len(tokens) // BS):  # full blocks only: a partial block is still being written
        parent = hash_block(parent, tokens[i * BS:(i + 1) * BS])
        hs.append(parent.hex()[:8])
    return hs


a = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
b = [5, 6, 7, 8, 9, 10, 11, 12, 99, 98, 97, 96, 95]
c = [0, 5, 6, 7, 8, 9, 10, 11, 12]  # same tokens shifted by one: nothing in common
print("a:", chain(a), "\nb:", chain(b), "\nc:", chain(c))
print("a and b share their first 2 blocks (8 tokens); c shares none, though it contains a's tokens")

# The engine: 3 requests = one prompt + a different suffix each; request 0 runs first, so its prompt
# blocks are computed and cached when the others arrive (vLLM's rule: only computed blocks are cached).
targs = parse(["--requests", "3", "--max-tokens", "2"])
targs.model = resolve_model(args.model)
doc = run_trace(targs)
for s in doc["steps"]:
    pc = s["prefix_cache"]
    print(f"step {s['step']}: scheduled {[(x['request'], x['kind'], x['tokens']) for x in s['scheduled']]}; "
          f"prefix lookups {pc['queries']} tokens, hits {pc['hits']} (admitted: {pc['hit_tokens']})")
    for rid, t in s["block_tables"].items():
        marks = [f"{b}*" if i < t["hit_blocks"] else str(b) for i, b in enumerate(t["blocks"])]
        print(f"    request {rid}: blocks [{' '.join(marks)}]  reference counts {t['refs']}")
sm = doc["summary"]
print(f"total: {sm['prefix_cache_queries']} tokens looked up, {sm['prefix_cache_hits']} found cached "
      f"({sm['prefix_cache_hits'] / sm['prefix_cache_queries']:.0%}); * = reused through a hit")
assert sm["prefix_cache_hits"] > 0
