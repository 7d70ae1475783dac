"""Lab 12 — prefix caching: chain hashes of full blocks, and three requests sharing one prompt.

Smallest working piece: `hash_block(parent, tokens)`. Equal hashes mean equal *prefixes*, because each
block's hash includes its parent's. Then the real thing: `inferlab trace`'s engine run with three
requests that share a prompt, showing which blocks are reused and the hit counters.

    python docs/handbook/labs/12_prefix_cache.py [--model DIR] [--real-model DIR]
"""
import argparse

from reference_engine.core.prefix_cache import ROOT, hash_block
from reference_engine.engine.trace import parse, resolve_model, run_trace

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
ap.add_argument("--real-model", help="a real model directory (default: models/smollm2-135m-instruct, made if absent)")
args = ap.parse_args()
BS = 4


def chain(tokens):
    hs, parent = [], ROOT
    for i in range(len(tokens) // BS):  # full blocks only: a partial block is still being written
        parent = hash_block(parent, tokens[i * BS:(i + 1) * BS])
        hs.append(parent.hex()[:8])
    return hs


def shared_blocks(x: list[str], y: list[str]) -> int:
    """How many leading block hashes two chains have in common: the blocks a later request can reuse."""
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return n


def sharing(name_x: str, x: list[str], name_y: str, y: list[str], bs: int) -> str:
    """The sentence the lab prints, from the hashes alone."""
    n = shared_blocks(x, y)
    return (f"{name_x} and {name_y} share their first {n} block{'s' * (n != 1)} ({n * bs} tokens)" if n else
            f"{name_x} and {name_y} share no block")


def contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i:i + len(part)] == part for i in range(len(seq) - len(part) + 1))


a = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
b = [5, 6, 7, 8, 9, 10, 11, 12, 99, 98, 97, 96, 95]
c = [0, 5, 6, 7, 8, 9, 10, 11, 12]  # a's first 8 tokens, shifted by one position
ha, hb, hc = chain(a), chain(b), chain(c)
print("a:", ha, "\nb:", hb, "\nc:", hc)
print(sharing("a", ha, "b", hb, BS))
print(sharing("a", ha, "c", hc, BS) + (f", though c contains a's first {2 * BS} tokens" if contains(c, a[:2 * BS]) else ""))

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

# A real conversation on the real model: turn 2's prompt is turn 1's conversation (system prompt, question,
# the model's answer) plus a new question, rendered by the chat template. How much of it is found cached?
from reference_engine.config import EngineConfig  # noqa: E402
from reference_engine.engine.llm_engine import LLMEngine  # noqa: E402
from reference_engine.sampling_params import SamplingParams  # noqa: E402
from reference_engine.engine.trace import resolve_real_model  # noqa: E402

eng = LLMEngine(EngineConfig(model=resolve_real_model(args.real_model), block_size=16, kv_cache_tokens=1024))
tok = eng.tokenizer
chat = [{"role": "user", "content": "What does a KV cache store?"}]
turn1 = tok.encode(tok.apply_chat_template(chat), add_special_tokens=False)
eng.add_request(turn1, SamplingParams(max_tokens=24, temperature=0.0), request_id="turn1")
answer = []
while eng.has_unfinished():
    for d in eng.step():
        answer += d.new_token_ids
chat += [{"role": "assistant", "content": tok.decode(answer)}, {"role": "user", "content": "And why is it paged?"}]
turn2 = tok.encode(tok.apply_chat_template(chat), add_special_tokens=False)
same = next((i for i, (x, y) in enumerate(zip(turn1 + answer, turn2)) if x != y), min(len(turn1 + answer), len(turn2)))
before = eng.stats()
eng.add_request(turn2, SamplingParams(max_tokens=1, temperature=0.0), request_id="turn2")
while eng.has_unfinished():
    eng.step()
hits = eng.stats().prefix_cache_hits - before.prefix_cache_hits
print(f"real conversation (SmolLM2-135M-Instruct, 16-token blocks): turn 1 = {len(turn1)} prompt + {len(answer)} "
      f"answer tokens; turn 2 = {len(turn2)} tokens, of which the first {same} repeat turn 1's tokens exactly; "
      f"{hits} found cached ({hits // 16} full blocks, {hits / len(turn2):.0%} of turn 2)")
