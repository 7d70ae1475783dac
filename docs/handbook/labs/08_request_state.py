"""Lab 08 — request state: WAITING -> RUNNING -> (PREEMPTED -> RUNNING) -> FINISHED.

Smallest working piece: one `Request` object and the fields the engine moves forward each step
(`status`, `num_computed_tokens`, `output_token_ids`, `block_table`). A KV pool too small for all
three requests forces a preemption, so every transition appears.

    python docs/handbook/labs/08_request_state.py [--model DIR]
"""
import argparse

from reference_engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.sampling_params import SamplingParams
from reference_engine.engine.trace import resolve_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
args = ap.parse_args()
# 6 blocks of 4 tokens = 24 slots; three requests that each grow to 8 + 8 = 16 tokens cannot all fit.
eng = LLMEngine(EngineConfig(model=resolve_model(args.model), block_size=4, kv_cache_tokens=24, record_steps=True))
params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
reqs = {}
for i in range(3):
    rid = eng.add_request([10 + i] * 8, params, request_id=f"r{i}")
    reqs[rid] = eng.requests[rid]

seen = {rid: [r.status.value] for rid, r in reqs.items()}
held_at_preemption = {}  # rid -> tokens it had when preempted
readmits = []  # (rid, step, tokens it had, tokens found in the prefix cache)
print("step | " + " | ".join(f"{rid}: status   computed/tokens  blocks" for rid in reqs))
while eng.has_unfinished():
    eng.step()
    rec = eng.step_records[-1]
    cells = []
    for rid, r in reqs.items():
        if seen[rid][-1] != r.status.value:
            seen[rid].append(r.status.value)
        cells.append(f"{rid}: {r.status.value:9} {r.num_computed_tokens:2}/{r.num_tokens:2}  {r.block_table}")
    note = f"  preempted {rec.preempted}" if rec.preempted else ""
    for rid in rec.preempted:
        held_at_preemption[rid] = reqs[rid].num_tokens
    for rid, hit in rec.prefix_hits.items():
        if rid in held_at_preemption:  # a re-admission: how much of its own KV survived?
            readmits.append((rid, rec.step, held_at_preemption.pop(rid), hit))
            note += f"  {rid} re-admitted: {hit} tokens hit"
    print(f"{rec.step:4} | " + " | ".join(cells) + note)

for rid, path in seen.items():
    print(f"{rid}: {' -> '.join(path)} ({reqs[rid].num_preemptions} preemption(s), finish: {reqs[rid].finish_reason})")
assert any("preempted" in p for p in seen.values()), "expected a preemption with this small pool"
# The conclusion comes from the counts above: blocks are freed tail-first and handed out oldest-first,
# so a preempted request's last block is often the next one another request gets.
for rid, step, held, hit in readmits:
    print(f"{rid}: preempted with {held} tokens, re-admitted at step {step} with {hit} of them found in the "
          f"prefix cache ({hit // eng.scheduler.stats().block_size} blocks); it recomputes {held - hit}")
