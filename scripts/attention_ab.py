"""A/B of the C++ decode-attention kernel: a commit's source (REV, default HEAD) against the working
tree's, built side by side and timed in one process, alternating; checks the outputs are bit-identical.
SmolLM2 shapes: 30 layers (each its own KV cache, so nothing stays cached), 9 heads / 3 kv heads,
D 64, blocks of 16 in a shuffled table, fp32, B sequences of context C, 2 threads.

    .venv/bin/python scripts/attention_ab.py B C [REV]      e.g. 8 160 HEAD~1
"""
import importlib.util, random, subprocess, sys, time
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from reference_engine.kernels import cpu_build  # noqa: E402
B, C = int(sys.argv[1]), int(sys.argv[2]); torch.set_num_threads(2)
root = __import__("pathlib").Path(__file__).resolve().parents[1]
rev = sys.argv[3] if len(sys.argv) > 3 else "HEAD"
old_src = subprocess.run(["git", "-C", str(root), "show", f"{rev}:reference_engine/attention/cpp_kernel.py"],
                         capture_output=True, text=True, check=True).stdout
ns = {}; exec(compile(old_src.split("@functools.cache")[0], "old", "exec"), ns)
spec = importlib.util.spec_from_file_location("newk", str(root / "reference_engine/attention/cpp_kernel.py"))
newk = importlib.util.module_from_spec(spec); spec.loader.exec_module(newk)
mods = {"old": cpu_build.load("ab_old_att", ns["SOURCE"], ["decode", "prefill"]),
        "new": cpu_build.load("ab_new_att", newk.SOURCE, ["decode", "prefill"])}
L, H, Hkv, D, bs = 30, 9, 3, 64, 16
nb = B * ((C + bs - 1) // bs) + 8
rng = random.Random(0)
caches = [(torch.randn(nb, bs, Hkv, D), torch.randn(nb, bs, Hkv, D)) for _ in range(L)]
per = (C + bs - 1) // bs
ids = list(range(nb)); rng.shuffle(ids)
tables = torch.tensor([ids[b * per:(b + 1) * per] for b in range(B)], dtype=torch.long)
lens = torch.full((B,), C, dtype=torch.long)
qs = [torch.randn(B, H, D) for _ in range(L)]
outs = {k: [torch.empty(B, H, D) for _ in range(L)] for k in mods}
def step(k):
    m = mods[k]
    for l in range(L):
        m.decode(qs[l], caches[l][0], caches[l][1], tables, lens, D ** -0.5, outs[k][l])
for k in mods: step(k)
same = all(torch.equal(a, b) for a, b in zip(outs["old"], outs["new"]))
t = {k: [] for k in mods}
for _ in range(40):
    for k in mods:
        s = time.perf_counter(); step(k); t[k].append(time.perf_counter() - s)
for k in mods:
    v = sorted(t[k]); print(f"{k}: 30 layers, B={B} C={C}: min {v[0]*1e3:.2f} ms, median {v[len(v)//2]*1e3:.2f} ms")
print("bit-identical:", same)
