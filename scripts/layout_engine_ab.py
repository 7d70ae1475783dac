"""The engine on SmolLM2-135M (fp32, or --dtype bfloat16), two source trees A/B in alternating processes (one run): load peak
RSS, bytes per weight read back from effective_config(), a 512-token prefill (TTFT of one request),
decode at 1 sequence and at 64 (offline), and the greedy tokens (must agree). Each process: 2 threads,
its own model load; medians over the rounds.

    .venv/bin/python scripts/layout_engine_ab.py OLD_TREE [NEW_TREE=.] [--rounds 3] [--dtype bfloat16]
e.g. OLD_TREE from `git archive <rev> | tar -x -C /tmp/old` (docs/perf/2026-12-04-one-layout.md).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time, torch
torch.set_num_threads(2)
from reference_engine import LLM, SamplingParams
t = time.perf_counter()
llm = LLM(sys.argv[1], dtype=sys.argv[2], max_num_seqs=64, kv_cache_tokens=64 * 640)
load_s = time.perf_counter() - t
peak = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
eff = llm.engine.effective_config()
g = torch.Generator().manual_seed(0)
V = llm.engine.model_config.vocab_size
def ids(n): return torch.randint(100, V - 100, (n,), generator=g).tolist()
def timed(prompts, n):
    p = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    t = time.perf_counter(); outs = llm.generate(prompts, p); return time.perf_counter() - t, outs
timed([ids(16)], 2)  # warm-up
ttft = min(timed([ids(512)], 1)[0] for _ in range(2))
dt1, o1 = timed([ids(16)], 33)
dt64, o64 = timed([ids(16) for _ in range(64)], 17)
print(json.dumps({"load_s": load_s, "peak_rss_mib": peak / 2**20, "bytes_per_weight": eff.get("bytes_per_weight"),
                  "layouts": eff.get("weights_layouts"), "ttft512_ms": ttft * 1e3,
                  "tpot1_ms": dt1 / 33 * 1e3, "tok_s_64": 64 * 17 / dt64,
                  "tokens": [list(o1[0].token_ids)] + [list(o.token_ids) for o in o64[:4]]}))
"""

p = argparse.ArgumentParser()
p.add_argument("old")
p.add_argument("new", nargs="?", default=".")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--model", default="models/smollm2-135m-instruct")
p.add_argument("--dtype", default="float32")
a = p.parse_args()
model = str(Path(a.model).resolve())
runs = {"old": [], "new": []}
for r in range(a.rounds):
    for side in ("old", "new"):
        tree = str(Path(getattr(a, side)).resolve())
        env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "2"}
        out = subprocess.run([sys.executable, "-c", CHILD, model, a.dtype], cwd=tree, env=env, capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"{side}: {out.stderr[-2000:]}")
        runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(side, r, {k: v for k, v in runs[side][-1].items() if k != "tokens"}, flush=True)
same = all(x["tokens"] == y["tokens"] for x in runs["old"] for y in runs["new"])
print(f"greedy tokens identical old vs new: {same}")
print("| metric | old | new | new / old |\n|---|---|---|---|")
for k in ("peak_rss_mib", "bytes_per_weight", "load_s", "ttft512_ms", "tpot1_ms", "tok_s_64"):
    o = statistics.median(x[k] for x in runs["old"])
    n = statistics.median(x[k] for x in runs["new"])
    print(f"| {k} | {o:.2f} | {n:.2f} | {n / o:.2f} |")
