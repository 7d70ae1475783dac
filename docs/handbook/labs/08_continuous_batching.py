"""Lab 08 — continuous batching: a finished request's seat is refilled at the very next step.

Smallest working piece: the engine's step loop with `max_num_seqs=4` seats and eight requests of
very different lengths. With static batching the batch runs until its longest member is done and
finished seats sit empty; with continuous batching (what every engine here does) waiting requests
join as soon as a seat frees. We count steps and seat occupancy for both.

    python docs/handbook/labs/08_continuous_batching.py [--model DIR]
"""
import argparse

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.sampling_params import SamplingParams
from reference_engine.trace import resolve_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
args = ap.parse_args()
SEATS = 4
lengths = [2, 12, 3, 10, 2, 9, 4, 3]  # max_tokens of each request
eng = LLMEngine(EngineConfig(model=resolve_model(args.model), max_num_seqs=SEATS, record_steps=True))
for i, n in enumerate(lengths):
    eng.add_request([20 + i] * 6, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), request_id=str(i))
while eng.has_unfinished():
    eng.step()
for rec in eng.step_records:
    seats = [rid for rid, _, _ in rec.scheduled]
    joined = [rid for rid, _, kind in rec.scheduled if kind == "prefill"]
    print(f"step {rec.step:2}: running {seats!s:22} " + (f"joined {joined}" if joined else "")
          + (f"  finished {rec.finished}" if rec.finished else ""))
cont_steps = len(eng.step_records)
cont_busy = sum(len(r.scheduled) for r in eng.step_records)

# Static batching: groups of SEATS in arrival order; each group runs as long as its longest request
# (one prefill step, then one step per further token), finished seats stay idle until the group ends.
groups = [lengths[i:i + SEATS] for i in range(0, len(lengths), SEATS)]
static_steps = sum(max(g) for g in groups)
static_busy = sum(sum(g) for g in groups)
print(f"continuous: {cont_steps} steps, seats busy {cont_busy}/{cont_steps * SEATS} "
      f"({cont_busy / (cont_steps * SEATS):.0%})")
print(f"static:     {static_steps} steps, seats busy {static_busy}/{static_steps * SEATS} "
      f"({static_busy / (static_steps * SEATS):.0%})")
assert cont_steps < static_steps
