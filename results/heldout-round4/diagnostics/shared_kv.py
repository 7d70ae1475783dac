"""After round 4 was seen (a diagnostic): do the large decode batches at load come out slow because the step model reads
every sequence's whole context from memory, while the sequences of this suite share 3 cached 320-token prefixes (the
same KV blocks, read once per step and then from the cache)? The Poisson run's served decode steps against the
profile as it is, and with the shared prefix tokens read once a step: each sequence's context less its prefix-cache
hit at admission, plus 0 (low) or 3 x 320 tokens (high: each prefix once) for the sequences that hit."""
import numpy as np

from experiments.simulate import sweep
from experiments.simulate.served_overhead import served_step
from experiments.simulate.step_model import ModelShape, Profile, features, predict, regime
from reference_engine.engine.step_log import read

prof = Profile.load("results/heldout-round4/profile.json")
m = ModelShape.from_dir("models/heldout-stout")
PREFIXES, PREFIX_LEN = 3, 320
out: dict = {}
for steps in read("results/heldout-round4/steps/heldout4_test_poisson.jsonl").values():
    hit: dict[str, int] = {}
    for rec, (s, d) in zip(steps, sweep.shapes(steps)):
        hit.update(rec.prefix_hits)
        for rid in rec.finished:
            hit.pop(rid, None)
        if regime(s, prof.fused_max_rows) != "decode":
            continue
        ids = [rid for rid, _, _ in rec.scheduled]
        ctx = sum(c for _, c, _ in s.seqs)
        hits = [hit.get(rid, 0) for rid in ids]
        own = ctx - sum(hits)
        shared = sum(1 for h in hits if h) and min(PREFIXES, sum(1 for h in hits if h)) * PREFIX_LEN
        kv = prof.regimes["decode"]["kv"] * features(s, m, prof)["kv"]
        base = predict(s, m, prof)
        b = len(s.seqs)
        edge = next(e for e in (1, 4, 8, 12, 16, 24, 32, 48, 64, 1 << 30) if b <= e)
        row = out.setdefault(edge, [])
        row.append([served_step(prof, p, b) / d - 1 for p in (base, base - kv * (1 - own / ctx),
                                                                 base - kv * (1 - (own + shared) / ctx))])
print("decode rows <= | steps | as the profile reads KV | shared prefix read once (low) | (high)")
for edge, v in sorted(out.items()):
    e = np.median(np.array(v), axis=0)
    print(f"{edge:>4} | {len(v):5d} | {e[0]:+6.1%} | {e[1]:+6.1%} | {e[2]:+6.1%}")
