"""Weights and KV cache on 2 MiB pages or on 4 KiB pages (INFERLAB_HUGEPAGES=0): the decode step of the
reference engine in process, A and B in alternating fresh processes (where a process's pages land is part of
what is measured, so each round is a new process), and how much the kernel put on huge pages.

    .venv/bin/python scripts/hugepages_ab.py [MODEL] [--rows 1,8,32] [--prompt 64] [--rounds 3] [--dtype float32]

Prints one line per process: rows, setting, the MiB of AnonHugePages, the decode step's min and median over
40 steps; then per row count the median over rounds of each setting's median, and the ratio.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time


def child(model: str, rows: int, prompt: int, dtype: str) -> None:
    from reference_engine import LLM, SamplingParams
    from reference_engine.model.hugepages import huge_bytes

    llm = LLM(model, dtype=dtype, kv_cache_tokens=rows * (prompt + 150) + 256, max_num_seqs=rows,
              max_num_batched_tokens=4096)
    e, rng = llm.engine, random.Random(0)
    for _ in range(rows):
        e.add_request([rng.randrange(3, 40000) for _ in range(prompt)],
                      SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))
    for _ in range(4 + rows * prompt // 4096):  # the prefill, then a few decodes
        e.step()
    dec = []
    for _ in range(40):
        t = time.perf_counter()
        e.step()
        dec.append(time.perf_counter() - t)
    print(f"{huge_bytes() / 2**20:.0f} {min(dec) * 1e3:.2f} {statistics.median(dec) * 1e3:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="models/smollm2-135m-instruct")
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        return child(a.model, a.child, a.prompt, a.dtype)
    med: dict[tuple[int, str], list[float]] = {}
    for r in range(a.rounds):
        for rows in map(int, a.rows.split(",")):
            order = ("1", "0") if r % 2 == 0 else ("0", "1")  # alternate which goes first
            for hp in order:
                out = subprocess.run([sys.executable, __file__, a.model, "--child", str(rows), "--prompt", str(a.prompt),
                                      "--dtype", a.dtype], env={**os.environ, "INFERLAB_HUGEPAGES": hp},
                                     check=True, capture_output=True, text=True).stdout.split()
                huge, lo, mid = out[-3:]
                label = "2 MiB" if hp == "1" else "4 KiB"
                print(f"round {r} rows {rows} {label}: huge {huge} MiB, decode min {lo} ms, median {mid} ms", flush=True)
                med.setdefault((rows, hp), []).append(float(mid))
    print(f"\n| rows | {a.dtype} 4 KiB pages, median ms | 2 MiB pages | 4 KiB / 2 MiB |\n|---|---|---|---|")
    for rows in map(int, a.rows.split(",")):
        small, huge = statistics.median(med[(rows, "0")]), statistics.median(med[(rows, "1")])
        print(f"| {rows} | {small:.2f} | {huge:.2f} | {small / huge:.2f}x |")


if __name__ == "__main__":
    main()
