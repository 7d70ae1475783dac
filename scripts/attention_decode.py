"""The C++ paged decode attention alone (csrc/attention_decode.cpp) on SmolLM2's attention shape (9 query
heads over 3 kv heads, head dim 64, 16-token blocks), for one batch of sequences; best of 300 calls.

    .venv/bin/python scripts/attention_decode.py THREADS LEN [LEN ...]

One sequence per LEN (its context, the query's own key included); blocks laid out one sequence after another.
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_engine.kernels import cpu_build  # noqa: E402

threads, lens = int(sys.argv[1]), [int(x) for x in sys.argv[2:]]
H, Hkv, D, bs = 9, 3, 64, 16
torch.set_num_threads(threads)
m = cpu_build.module()
nbs = [(n + bs - 1) // bs for n in lens]
kc, vc = torch.randn(sum(nbs), bs, Hkv, D), torch.randn(sum(nbs), bs, Hkv, D)
width, first, rows = max(nbs), 0, []
for nb in nbs:
    rows.append(list(range(first, first + nb)) + [0] * (width - nb))
    first += nb
tables, seq_lens = torch.tensor(rows), torch.tensor(lens)
q = torch.randn(len(lens), H, D)
out = torch.empty_like(q)
ts = []
for _ in range(300):
    t = time.perf_counter()
    m.decode(q, kc, vc, tables, seq_lens, D ** -0.5, out)
    ts.append(time.perf_counter() - t)
print(f"threads {threads}, {len(lens)} sequences, {sum(lens)} keys: best {min(ts) * 1e6:.0f} us, "
      f"median {sorted(ts)[len(ts) // 2] * 1e6:.0f} us")
