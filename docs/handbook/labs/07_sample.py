"""Lab 07 — sampling: from logits to one token, stage by stage.

Smallest working piece: one row of logits -> temperature -> min-p -> top-k -> top-p -> draw. We use the
engine's own functions (`reference_engine/worker/sampler.py`) on a small made-up vocabulary so every
probability fits on a line, then check the draw's frequencies and seeded reproducibility.

    python docs/handbook/labs/07_sample.py
"""
import torch

from reference_engine.worker.sampler import apply_top_k_top_p, draw, make_batch, process, sample
from reference_engine.sampling_params import SamplingParams

words = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "hat", "."]
logits = torch.tensor([[3.0, 2.5, 2.0, 1.8, 1.0, 0.5, 0.2, 0.0, -0.5, -1.0]])  # (S=1, V=10)


def show(name, x):
    p = x.softmax(-1)[0]
    print(f"{name:28}" + " ".join(f"{w}:{v:.2f}" for w, v in zip(words, p.tolist()) if v > 0.005))


show("softmax(logits)", logits)
show("temperature 0.5 (sharper)", logits / 0.5)
show("temperature 2.0 (flatter)", logits / 2.0)
show("top-k 3", apply_top_k_top_p(logits, torch.tensor([3]), torch.tensor([1.0])))
show("top-p 0.8", apply_top_k_top_p(logits, torch.tensor([-1]), torch.tensor([0.8])))
show("top-k 2, ties kept", apply_top_k_top_p(torch.tensor([[3.0, 2.0, 2.0, 1.0]]), torch.tensor([2]),
                                             torch.tensor([1.0])))

# Order matters: vLLM applies min-p before top-p. p = [.4, .3, .2, .1], min_p .4, top_p .75 -> [.57, .43, 0, 0].
row = make_batch([SamplingParams(min_p=0.4, top_p=0.75)], [[]], [[]], [None], "cpu")
both = process(torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log(), row)[0].softmax(-1)[0]
print("min-p 0.4 then top-p 0.75  ", " ".join(f"{v:.2f}" for v in both.tolist()))
assert torch.allclose(both, torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))

# Greedy is an argmax: no randomness at all.
greedy = make_batch([SamplingParams(temperature=0.0)], [[]], [[]], [None], "cpu")
print("greedy ->", words[int(sample(logits, greedy, torch.Generator().manual_seed(0)))])
# Only T = 0 is greedy: a positive temperature below 0.01 is raised to 0.01 when the params are made,
# before the greedy test (T < 1e-5), as vLLM's SamplingParams.__post_init__ does.
for t in (0.0, 1e-6, 0.005, 0.5):
    sp = SamplingParams(temperature=t)
    print(f"temperature {t:g} -> stored as {sp.temperature:g}: {'greedy (argmax)' if sp.greedy else 'sampled'}")

# The draw: exponential race, argmax(p / q) with q ~ Exp(1), equals sampling from p.
p = (logits / 0.8).softmax(-1)
g = torch.Generator().manual_seed(0)
counts = torch.bincount(torch.cat([draw(p, [None], g) for _ in range(4000)]), minlength=10) / 4000
print("p        ", " ".join(f"{v:.3f}" for v in p[0].tolist()))
print("observed ", " ".join(f"{v:.3f}" for v in counts.tolist()))
assert (counts - p[0]).abs().max() < 0.03

# Seeded requests use their own generator: the same seed gives the same token, whatever the batch.
params = SamplingParams(temperature=0.8, top_p=0.9, seed=42)
one = make_batch([params], [[]], [[]], [torch.Generator().manual_seed(42)], "cpu")
two = make_batch([params, SamplingParams(temperature=1.0)], [[], []], [[], []],
                 [torch.Generator().manual_seed(42), None], "cpu")
a = sample(logits, one, torch.Generator().manual_seed(1))
b = sample(logits.repeat(2, 1), two, torch.Generator().manual_seed(2))
print(f"seed 42 alone -> {words[int(a[0])]}, seed 42 next to another request -> {words[int(b[0])]}")
assert int(a[0]) == int(b[0])
