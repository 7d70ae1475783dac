"""Round 8 diagnostic: does a fit model's one-row decode speed follow the huge-page share of its engine's memory?
Each run: a fresh engine of the model in this process (probe.one_row_steps, as the anchor of round 7 timed it), the
median one-row step, and from /proc/self/smaps the anonymous mappings over 256 MiB with their AnonHugePages share.
Run: PYTHONPATH=. .venv/bin/python results/heldout-round8/diagnostics/hugepages.py MODEL_DIR [MODEL_DIR ...]"""
import gc
import re
import statistics
import sys
import time



def big_maps(min_kb: int = 256 * 1024) -> list[tuple[int, int]]:
    out, cur = [], None
    for line in open("/proc/self/smaps"):
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$", line)
        if m:
            cur = [(int(m[2], 16) - int(m[1], 16)) // 1024, 0, 0, m[3]]
            out.append(cur)
        elif line.startswith("Rss:"):
            cur[1] = int(line.split()[1])
        elif line.startswith("AnonHugePages:"):
            cur[2] = int(line.split()[1])
    return [(rss, huge) for size, rss, huge, name in out if size >= min_kb and not name and rss]


def one_row(d: str) -> tuple[float, list]:
    """probe.one_row_steps' engine and requests, the smaps read while the engine lives."""
    from experiments.simulate import sweep
    from reference_engine import EngineConfig, LLMEngine, SamplingParams

    eng = LLMEngine(EngineConfig(model=d, dtype="float32", num_threads=2, kv_cache_tokens=4096, record_steps=True,
                                 enable_prefix_caching=False))
    for _ in range(2):
        eng.add_request([5 + i % 4000 for i in range(768)], SamplingParams(max_tokens=48, ignore_eos=True, temperature=0.0))
        while eng.has_unfinished():
            eng.step()
    steps = [t for s, t in sweep.shapes(eng.step_records) if len(s.seqs) == 1 and s.seqs[0][0] == 1]
    return statistics.median(steps[10:47] + steps[57:]), big_maps()


for d in sys.argv[1:]:
    ms, maps = one_row(d)
    print(f"{time.strftime('%H:%M:%S')} {d}: {ms * 1e3:.1f} ms; anonymous maps over 256 MiB (rss MiB, huge %): "
          + ", ".join(f"{r / 1024:.0f} {h / r:.0%}" for r, h in maps), flush=True)
    gc.collect()
