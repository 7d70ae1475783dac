"""Round 8 diagnostic: does a fresh engine that starts slow speed up while it runs? One engine of MODEL in this
(fresh) process, then one-row decode bursts (a 768-token prompt, 24 tokens, the median of the last 20 steps) back to
back for SECONDS, each burst's median printed with the time since the engine was built. The guest reports freed
2 MiB blocks to the host (virtio-balloon free page reporting: feature bit 5 in /sys/bus/virtio/devices/virtio0/features,
page_reporting_order 9), so a fresh mapping may be backed afresh by the host.
Run: PYTHONPATH=. .venv/bin/python results/heldout-round8/diagnostics/warm_up.py models/heldout-mid 150"""
import statistics
import sys
import time

from experiments.simulate import sweep
from reference_engine import EngineConfig, LLMEngine, SamplingParams

model, seconds = sys.argv[1], float(sys.argv[2])
eng = LLMEngine(EngineConfig(model=model, dtype="float32", num_threads=2, kv_cache_tokens=4096, record_steps=True,
                             enable_prefix_caching=False))
t0 = time.monotonic()
while time.monotonic() - t0 < seconds:
    eng.step_records.clear()
    eng.add_request([5 + i for i in range(768)], SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.0))
    while eng.has_unfinished():
        eng.step()
    steps = [t for s, t in sweep.shapes(eng.step_records) if len(s.seqs) == 1 and s.seqs[0][0] == 1]
    print(f"{time.strftime('%H:%M:%S')} +{time.monotonic() - t0:5.0f} s: {statistics.median(steps[-20:]) * 1e3:.1f} ms", flush=True)
