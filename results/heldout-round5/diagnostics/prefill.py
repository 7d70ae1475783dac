"""After round 5 was seen (a diagnostic): round 5's mixed steps came out slow in the simulator (teacher-forced +14-19 %,
served prefill steps +13-21 %, decode steps +3-9 %). Side by side, in-process, quiet: single-sequence prefill steps of
a fit model (deep, mid) and the spent test model (lean), fresh (128 and 448 tokens) and a 128-token chunk after a
cached 448-token prefix (context 576, lean's suite's shape), each the median of 5, against the round's profile."""
import statistics
import sys

from experiments.simulate import sweep
from experiments.simulate.step_model import ModelShape, Profile, StepShape, features, predict, coefficient, TERMS
from reference_engine import LLMEngine, SamplingParams

prof = Profile.load("results/heldout-round5/profile.json")
co = prof.regimes["mixed"]


def timed(eng, prompt) -> float:
    s0 = len(eng.step_records)
    eng.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0))
    while eng.has_unfinished():
        eng.step()
    return eng.step_records[s0].duration_s


for name in sys.argv[1:] or ["deep", "mid", "lean"]:
    d = f"models/heldout-{name}"
    c = sweep.engine_config(d, "float32", {"num_threads": 2}, kv_cache_tokens=8192, max_model_len=4096)
    eng = LLMEngine(type(c)(**{**c.__dict__, "record_steps": True, "enable_prefix_caching": True,
                               "max_num_batched_tokens": 448}))
    m = ModelShape.from_dir(d)
    v = eng.model_config.vocab_size
    for label, shape, make in [
        ("fresh 128", ((128, 128, 1),), lambda i: [(i * 7919 + j * 31) % (v - 3) + 3 for j in range(128)]),
        ("fresh 448", ((448, 448, 1),), lambda i: [(i * 7919 + j * 37) % (v - 3) + 3 for j in range(448)]),
        ("128 after a cached 448", ((128, 576, 1),), None),
    ]:
        ts = []
        for i in range(6):
            if make:
                ts.append(timed(eng, make(i + 1)))
            else:
                head = [(i * 104729 + j * 41) % (v - 3) + 3 for j in range(448)]
                timed(eng, head)  # caches the prefix (448 = 28 blocks of 16)
                ts.append(timed(eng, head + [(i * 13 + j * 43) % (v - 3) + 3 for j in range(128)]))
        t = statistics.median(ts[1:])
        s = StepShape(shape)
        f = features(s, m, prof)
        terms = " ".join(f"{k} {coefficient(co, k) * f[k] * 1e3:.1f}" for k in TERMS if coefficient(co, k) * f[k] > 1e-4)
        print(f"{name:5s} {label:24s} measured {t * 1e3:7.1f} ms, predicted {predict(s, m, prof) * 1e3:7.1f} ms "
              f"({predict(s, m, prof) / t - 1:+.1%}): {terms}")
