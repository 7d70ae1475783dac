"""Lab 09 — scheduling: one token budget per step, no model at all.

Smallest working piece: the `Scheduler` (which builds its own `KVCacheManager`), fed plain `Request`
objects. Each
step it spends `max_num_batched_tokens` on running requests first, then admits waiting ones; a
prompt larger than what is left is split (chunked prefill). We play the model's part by appending
one fake token to every request whose step reached the end of its tokens.

    python docs/handbook/labs/09_schedule.py
"""
from reference_engine.config import EngineConfig
from reference_engine.core.request import Request
from reference_engine.sampling_params import SamplingParams
from reference_engine.core.scheduler import Scheduler

# prefix caching off: this lab is about the budget alone (chapter 12 turns it on)
cfg = EngineConfig(model="unused", max_num_batched_tokens=16, block_size=4, enable_prefix_caching=False)
sched = Scheduler(cfg, num_blocks=64)
params = SamplingParams(max_tokens=3, ignore_eos=True)
for rid, n, first in [("long", 40, 100), ("mid", 10, 200), ("short", 5, 300)]:
    sched.add(Request(rid, list(range(first, first + n)), params))

step = 0
while sched.has_work():
    out = sched.schedule()
    parts = []
    for req, n in out.scheduled:
        kind = "decode" if req.output_token_ids and req.num_new_tokens == 1 else "prefill"
        parts.append(f"{req.request_id} {kind} {n} (tokens {req.num_computed_tokens}..{req.num_computed_tokens + n})")
    print(f"step {step}: budget {cfg.max_num_batched_tokens}, used {out.num_tokens:2}: " + ", ".join(parts))
    # The model's part: a request whose scheduled tokens reach its end samples one token.
    for req, n in out.scheduled:
        if req.num_computed_tokens + n == req.num_tokens:
            req.output_token_ids.append(7)
            if len(req.output_token_ids) >= req.params.max_tokens:
                req.finish("length")
    done = sched.update_from_output(out, {}, {})
    if done:
        print(f"        finished: {[r.request_id for r in done]}")
    step += 1
