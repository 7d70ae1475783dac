"""Lab 10 — continuous batching: a finished request's seat is refilled at the very next step.

Smallest working piece: the engine's step loop with `max_num_seqs=4` seats and eight requests of
very different lengths. With static batching the batch runs until its longest member is done and
finished seats sit empty; with continuous batching (what every engine here does) waiting requests
join as soon as a seat frees. Both run through the engine (static: each group of four is added only
when the previous group has finished), and the verdict compares the two runs' step counts; the
on-paper count (the sum of each group's longest request) is printed beside the static run.

    python docs/handbook/labs/10_continuous_batching.py [--model DIR]
"""
import argparse

from reference_engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.sampling_params import SamplingParams
from reference_engine.engine.trace import resolve_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
args = ap.parse_args()
SEATS = 4
lengths = [2, 12, 3, 10, 2, 9, 4, 3]  # max_tokens of each request


def run(static: bool) -> list:
    """Every step's record. Continuous: all eight requests queue at once and take seats as they free.
    Static: groups of SEATS in arrival order; a group is added only when the previous one has finished,
    so a finished request's seat stays empty until its whole group is done."""
    eng = LLMEngine(EngineConfig(model=resolve_model(args.model), max_num_seqs=SEATS, record_steps=True))
    groups = [range(i, min(i + SEATS, len(lengths))) for i in range(0, len(lengths), SEATS)] if static else \
        [range(len(lengths))]
    for group in groups:
        for i in group:
            eng.add_request([20 + i] * 6, SamplingParams(max_tokens=lengths[i], temperature=0.0, ignore_eos=True),
                            request_id=str(i))
        while eng.has_unfinished():
            eng.step()
    return eng.step_records


def compare(cont_steps: int, static_steps: int) -> str:
    """The verdict, from the two runs' step counts."""
    if cont_steps < static_steps:
        return f"continuous batching finished in {static_steps - cont_steps} fewer steps than static batching"
    if cont_steps > static_steps:
        return f"continuous batching took {cont_steps - static_steps} more steps than static batching"
    return "continuous and static batching took the same number of steps"


cont, static = run(static=False), run(static=True)
for rec in cont:
    seats = [rid for rid, _, _ in rec.scheduled]
    joined = [rid for rid, _, kind in rec.scheduled if kind == "prefill"]
    print(f"step {rec.step:2}: running {seats!s:22} " + (f"joined {joined}" if joined else "")
          + (f"  finished {rec.finished}" if rec.finished else ""))
results = {}
for name, recs in (("continuous", cont), ("static", static)):
    steps, busy = len(recs), sum(len(r.scheduled) for r in recs)
    results[name] = steps
    print(f"{name + ':':<12}{steps} steps, seats busy {busy}/{steps * SEATS} ({busy / (steps * SEATS):.0%})"
          + (" (run: each group of 4 added when the previous group finished)" if name == "static" else ""))
groups = [lengths[i:i + SEATS] for i in range(0, len(lengths), SEATS)]
print(f"static, on paper: each group runs as long as its longest request: "
      f"{' + '.join(str(max(g)) for g in groups)} = {sum(max(g) for g in groups)} steps, "
      f"{sum(map(sum, groups))} seat-steps busy (the run {'agrees' if sum(max(g) for g in groups) == results['static'] else 'differs'})")
print(compare(results["continuous"], results["static"]))
