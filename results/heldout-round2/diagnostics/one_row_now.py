"""Diagnostic (after round 1's test was seen; fits nothing): one-row decode steps, measured in-process, against
round 1's profile, on a 768-wide model of wide's byte count (small's shape with 30 layers) and on wide."""
import sys
import numpy as np
from pathlib import Path
from reference_engine import EngineConfig, LLMEngine, SamplingParams
from reference_engine.model.make import make_model
from experiments.simulate import sweep
from experiments.simulate.step_model import ModelShape, Profile, predict

prof = Profile.load("results/heldout-round2/profile.json")
if not Path("models/diag-narrow30/config.json").is_file():
    make_model("models/diag-narrow30", "small", seed=5, config_overrides={"num_hidden_layers": 30})
for d in ("models/heldout-broad", "models/heldout-deep"):
    eng = LLMEngine(EngineConfig(model=d, dtype="float32", num_threads=2, kv_cache_tokens=4096, record_steps=True,
                                 enable_prefix_caching=False))
    for rep in range(2):
        eng.add_request(list(range(5, 69)), SamplingParams(max_tokens=48, ignore_eos=True, temperature=0.0))
        while eng.has_unfinished():
            eng.step()
    rows = [(s, t) for s, t in sweep.shapes(eng.step_records) if len(s.seqs) == 1 and s.seqs[0][0] == 1][10:]
    m = ModelShape.from_dir(d)
    meas = float(np.median([t for _, t in rows]))
    pred = float(np.median([predict(s, m, prof) for s, _ in rows]))
    print(f"{d}: {m.weight_bytes / 1e6:.0f} MB, hidden {m.hidden}, {m.layers} layers: one-row decode measured {meas * 1e3:.2f} ms "
          f"({m.weight_bytes / meas / 1e9:.1f} GB/s of weights), predicted {pred * 1e3:.2f} ms ({pred / meas - 1:+.1%})", flush=True)
    del eng
