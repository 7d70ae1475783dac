"""The one-row decode step over time, in fresh processes: does this machine hold one speed?

    .venv/bin/python scripts/decode_drift.py [MODEL] [--processes 4] [--windows 12]

Each process loads the model (fp32, 2 threads), then serves one 64-token prompt after another and
prints, per window of 30 decode steps, the median step (ms) and the MiB its weights and KV cache
hold on 2 MiB pages (AnonHugePages). The kernel's THP counters (thp_fault_fallback, compact_stall)
are printed before and after. On the 2-core Zen 4 VM of 2026-12-05 the step sat at ~13.5-14.5 ms or
at ~19-20 ms, for seconds to a whole process, with every page huge both times
(docs/perf/2026-12-05-simulate-5.md).
"""
from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time


def child(model: str, windows: int) -> None:
    from reference_engine import LLM, SamplingParams
    from reference_engine.model.hugepages import huge_bytes

    llm = LLM(model, dtype="float32", kv_cache_tokens=2048, max_num_seqs=1, num_threads=2)
    e, rng, t0 = llm.engine, random.Random(0), time.time()
    for _ in range(windows):
        e.add_request([rng.randrange(3, 40000) for _ in range(64)],
                      SamplingParams(max_tokens=38, temperature=0.0, ignore_eos=True))
        for _ in range(3):
            e.step()
        d = []
        for _ in range(30):
            t = time.perf_counter()
            e.step()
            d.append(time.perf_counter() - t)
        while e.has_unfinished():
            e.step()
        print(f"{time.time() - t0:.1f}s {statistics.median(d) * 1e3:.1f}ms {huge_bytes() / 2**20:.0f}MiB", flush=True)


def counters() -> str:
    keep = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall")
    return " ".join(ln.strip() for ln in open("/proc/vmstat") if ln.split()[0] in keep)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="models/smollm2-135m-instruct")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.model, a.windows)
    print(counters())
    for i in range(a.processes):
        out = subprocess.run([sys.executable, __file__, a.model, "--windows", str(a.windows), "--child"],
                             check=True, capture_output=True, text=True).stdout.split("\n")
        print(f"process {i + 1}: " + "  ".join(ln.split()[1] for ln in out if ln.strip())
              + f"   (huge: {out[-2].split()[2] if len(out) > 1 else '?'})", flush=True)
    print(counters())


if __name__ == "__main__":
    main()
