"""A/B of the C++ attention kernel: a commit's source (REV, default HEAD) against the working tree's,
built side by side and timed in one process, alternating; prints the largest difference between their
outputs (0.0: bit-identical). SmolLM2 shapes: 30 layers (each its own KV cache, so nothing stays
cached), 9 heads / 3 kv heads, D 64, blocks of 16 in a shuffled table, fp32, 2 threads.
decode: B sequences of context C, one query each; prefill: B sequences whose whole C-token prompt is
the query chunk (causal).

    .venv/bin/python scripts/attention_ab.py decode|prefill B C [REV]      e.g. decode 8 160 HEAD~1
"""
import random, subprocess, sys, time
from pathlib import Path
import torch
root = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(root))
from reference_engine.kernels import cpu_build  # noqa: E402
mode, B, C = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); torch.set_num_threads(2)
rev = sys.argv[4] if len(sys.argv) > 4 else "HEAD"


def source(get):
    """The kernel's C++ source from `get(path)` (a file's text, or None where it does not exist)."""
    ns = {}
    exec(compile(get("reference_engine/attention/cpp_kernel.py").split("@functools.cache")[0]
                 .replace("from reference_engine.attention import cpp_prefill\n", ""), "k", "exec"), ns)
    extra = get("reference_engine/attention/cpp_prefill.py")  # the prefill half, from 2026-12-02 on
    if extra:
        exec(compile(extra, "p", "exec"), ns2 := {})
        return ns["SOURCE"] + ns2["SOURCE"]
    return ns["SOURCE"]


def at_rev(path):
    r = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{path}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def in_tree(path):
    p = root / path
    return p.read_text() if p.exists() else None


mods = {"old": cpu_build.load("ab_old_att", source(at_rev), ["decode", "prefill"]),
        "new": cpu_build.load("ab_new_att", source(in_tree), ["decode", "prefill"])}
L, H, Hkv, D, bs = 30, 9, 3, 64, 16
per = (C + bs - 1) // bs
nb = B * per + 8
rng = random.Random(0)
caches = [(torch.randn(nb, bs, Hkv, D), torch.randn(nb, bs, Hkv, D)) for _ in range(L)]
ids = list(range(nb)); rng.shuffle(ids)
tables = torch.tensor([ids[b * per:(b + 1) * per] for b in range(B)], dtype=torch.long)
lens = torch.full((B,), C, dtype=torch.long)
rows = B if mode == "decode" else B * C
starts = torch.arange(B + 1, dtype=torch.long) * C
qs = [torch.randn(rows, H, D) for _ in range(L)]
outs = {k: [torch.empty(rows, H, D) for _ in range(L)] for k in mods}


def step(k):
    m = mods[k]
    for i in range(L):
        if mode == "decode":
            m.decode(qs[i], caches[i][0], caches[i][1], tables, lens, D ** -0.5, outs[k][i])
        else:
            m.prefill(qs[i], caches[i][0], caches[i][1], tables, lens, starts, D ** -0.5, outs[k][i])


for k in mods: step(k)
diff = max((a - b).abs().max().item() for a, b in zip(outs["old"], outs["new"]))
t = {k: [] for k in mods}
for _ in range(40 if mode == "decode" else 10):
    for k in mods:
        s = time.perf_counter(); step(k); t[k].append(time.perf_counter() - s)
for k in mods:
    v = sorted(t[k]); print(f"{k}: {mode}, 30 layers, B={B} C={C}: min {v[0]*1e3:.2f} ms, median {v[len(v)//2]*1e3:.2f} ms")
print("largest difference old vs new:", diff)
