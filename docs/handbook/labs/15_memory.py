"""Lab 15 (memory) — where the memory goes, step by step, as requests arrive and finish.

Smallest working piece: the engine's own `LLMEngine.memory_report()` (weights, each weight layout held
beside them by name, KV allocated, KV bytes per token, the KV peak; on CUDA also the activation peak of a
profile forward, the CUDA-graph pool and the device's readings; on CPU the process's RSS before the
weights and its high-water since start) and each step's KV blocks in use from `StepRecord`. Weights and
the KV pool are allocated once at start; only the share of the pool in use moves. Activations live for
one step: the lab estimates a step's largest live set from its shapes (`memory_plan.activation_estimate`,
the figure the engine's RAM check at start uses) and says so. The tiny model, so every number is the
same on every machine.

    python docs/handbook/labs/15_memory.py [--model DIR]
"""
import argparse

from reference_engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.sampling_params import SamplingParams
from reference_engine.engine.trace import resolve_model
from reference_engine.worker.memory_plan import activation_estimate

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
args = ap.parse_args()
eng = LLMEngine(EngineConfig(model=resolve_model(args.model), block_size=4, kv_cache_tokens=256, record_steps=True))
mc, mem = eng.model_config, eng.memory_report()
block_bytes = mem["kv_bytes_per_token"] * 4


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


layouts = {k.removeprefix("layout_"): v for k, v in mem.items() if k.startswith("layout_")}  # CPU: beside the weights
packed = sum(layouts.values())
print(f"at start: weights {mib(mem['weights'])} ({mem['weights']:,} B)"
      + "".join(f" + layout {name} {mib(v)}" for name, v in layouts.items())
      + f", KV allocated {mib(mem['kv_allocated'])} "
      f"({mem['kv_allocated'] // block_bytes} blocks of {block_bytes:,} B), activations: "
      + (f"peak {mib(mem['activation_peak'])} (profile forward)" if "device_total" in mem else
         "estimated per step below"))
arrivals = {0: ("r0", 40, 8), 2: ("r1", 24, 6), 4: ("r2", 12, 10)}  # step -> (id, prompt tokens, output tokens)
params = lambda n: SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)  # noqa: E731
print(f"{'step':>4}  {'event':<22} {'running':>7} {'KV used':>9} {'blocks':>6} {'of pool':>7} {'act. est.':>10}")
step, peak_blocks = 0, 0
while eng.has_unfinished() or step in arrivals or step < max(arrivals):
    event = ""
    if step in arrivals:
        rid, n_in, n_out = arrivals[step]
        eng.add_request(list(range(100, 100 + n_in)), params(n_out), request_id=rid)
        event = f"{rid} arrives ({n_in} tokens)"
    if eng.has_unfinished():
        eng.step()
        rec = eng.step_records[-1]
        if rec.finished:
            event += ("; " if event else "") + " ".join(rec.finished) + " finished"
        tokens = rec.num_prefill_tokens + rec.num_decode_tokens
        act = activation_estimate(mc, tokens, len(rec.new_tokens) or 1)
        peak_blocks = max(peak_blocks, rec.kv_blocks_used)
        print(f"{rec.step:>4}  {event:<22} {rec.num_running:>7} {mib(rec.kv_blocks_used * block_bytes):>9} "
              f"{rec.kv_blocks_used:>6} {rec.kv_blocks_used / (rec.kv_blocks_used + rec.kv_blocks_free):>7.0%} "
              f"{mib(act):>10}")
    step += 1
end = eng.memory_report()
print(f"KV peak (engine's counter): {end['kv_peak_used']:,} B = {end['kv_peak_used'] // block_bytes} blocks; "
      f"the step records, taken after each step, saw {peak_blocks} blocks at most"
      + ("" if end["kv_peak_used"] == peak_blocks * block_bytes else
         " (the counter also sees blocks held inside a step and freed before it ended)"))
total = mem["weights"] + packed + mem["kv_allocated"]
print(f"so, of {mib(total)} allocated up front, the weights (with their layouts) are "
      f"{(mem['weights'] + packed) / total:.0%} and the KV pool {mem['kv_allocated'] / total:.0%}; this workload "
      f"used at most {end['kv_peak_used'] / mem['kv_allocated']:.0%} of the pool, and "
      f"{'every block is free again' if eng.scheduler.stats().kv_used_blocks == 0 else 'blocks are still held'} "
      f"after the last request finished")
assert end["kv_peak_used"] >= peak_blocks * block_bytes
