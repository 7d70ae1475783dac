"""After round 5 was seen (a diagnostic): is the sweep's slow one-row step (mid: 57.5 ms in the calibration sweep,
50.5 / 49.2 ms in the drift control after it) the time it ran at, or the sweep's set-up (four engines up at once,
prefix caching on, a 65,536-token KV cache each)? Now, on the quiet machine: mid's 1-stream ragged level of the
round's sweep (seed 0, as calibrate runs it), first with mid's engine alone, then with all four fit engines up (as
`sweep_many` holds them), then alone again; each time the one-row decode steps at contexts 512-1024, median ms."""
import statistics
import sys

from experiments.simulate import probe, sweep
from experiments.simulate.step_model import Profile, StepShape
from reference_engine import LLMEngine

prof = Profile.load("results/heldout-round5/profile.json")
opts = {"mode": "server", "num_threads": int(sys.argv[1]) if len(sys.argv) > 1 else 2}


def cfg(name):
    c = sweep.engine_config(f"models/heldout-{name}", "float32", opts, kv_cache_tokens=65536, max_model_len=4096)
    return type(c)(**{**c.__dict__, "record_steps": True, "enable_prefix_caching": True})


def level1(eng) -> float:
    work = [(p, m) for c, p, m in sweep.ragged(0, eng.model_config.vocab_size) if c == 1]
    s0 = len(eng.step_records)
    sweep.closed_loop(eng, work, 1)
    got = [t for s, t in sweep.shapes(eng.step_records[s0:])
           if len(s.seqs) == 1 and s.seqs[0][0] == 1 and 512 <= s.seqs[0][1] <= 1024]
    return statistics.median(got) * 1e3, len(got)


print(f"threads {opts['num_threads']}; gemm pass over mid: "
      f"{probe.gemm_pass(__import__('experiments.simulate.step_model', fromlist=['ModelShape']).ModelShape.from_dir('models/heldout-mid'), opts['num_threads']) * 1e3:.1f} ms")
mid = LLMEngine(cfg("mid"))
print("mid alone: %.2f ms (%d steps)" % level1(mid))
others = [LLMEngine(cfg(n)) for n in ("tiny", "deep", "wide")]
for e in others:
    level1(e)
print("mid with tiny, deep, wide up (each ran its level first): %.2f ms (%d steps)" % level1(mid))
del others
print("mid alone again: %.2f ms (%d steps)" % level1(mid))
