"""Verification of draft tokens (pure functions): greedy acceptance, and a chi-square test that
speculative sampling reproduces the target's distribution -- which a wrong acceptance rule fails."""
from __future__ import annotations

import itertools

import torch

from reference_engine.spec_decode.rejection_sampler import draw_one, greedy_verify, rejection_sample

# A 5-token vocabulary where the draft disagrees with the target on purpose.
P = torch.tensor([0.05, 0.40, 0.25, 0.20, 0.10])  # target: next-token distribution at every position
Q = torch.tensor([0.40, 0.10, 0.10, 0.30, 0.10])  # draft
V, K, N = 5, 2, 5000
# The statistic over the V*V cells of (first, second) emitted token has V*V - 1 = 24 degrees of
# freedom; its 0.999 quantile is 51.18. With the seeds fixed below the test is deterministic; a correct
# sampler would exceed the bound one time in a thousand seeds.
CRITICAL_24DF_0999 = 51.18


def chi_square(pairs: list[tuple[int, int]]) -> float:
    obs = torch.zeros(V, V)
    for a, b in pairs:
        obs[a, b] += 1
    exp = torch.outer(P, P) * len(pairs)  # the target emits i.i.d. tokens from P
    return float(((obs - exp) ** 2 / exp).sum())


def first_two_tokens(verify, point_mass: bool, seed: int) -> list[tuple[int, int]]:
    """N times: run propose -> verify rounds until two tokens are out, keep those two."""
    g = torch.Generator().manual_seed(seed)
    target = P.expand(K + 1, V)
    pairs = []
    for _ in range(N):
        out: list[int] = []
        while len(out) < 2:
            if point_mass:  # an n-gram style proposer: fixed guesses, no distribution
                drafts, q = [1, 3], None
            else:
                drafts = torch.multinomial(Q, K, replacement=True, generator=g).tolist()
                q = Q.expand(K, V)
            out += verify(target, drafts, q, g)
        pairs.append((out[0], out[1]))
    return pairs


def accept_always(target, drafts, q, g):
    return drafts + [draw_one(target[len(drafts)], g)]


def no_residual(target, drafts, q, g):
    """The acceptance test is right, but a rejected draft is replaced by a draw from p, not from
    norm(max(p - q, 0)): tokens the draft likes get counted twice."""
    k = len(drafts)
    u = torch.rand(k, generator=g)
    for j, d in enumerate(drafts):
        qj = q[j, d] if q is not None else 1.0
        if not u[j] * qj < target[j, d]:
            return drafts[:j] + [draw_one(target[j], g)]
    return drafts + [draw_one(target[k], g)]


def test_speculative_sampling_reproduces_the_target_distribution():
    assert chi_square(first_two_tokens(rejection_sample, point_mass=False, seed=1)) < CRITICAL_24DF_0999


def test_point_mass_drafts_also_reproduce_the_target_distribution():
    assert chi_square(first_two_tokens(rejection_sample, point_mass=True, seed=2)) < CRITICAL_24DF_0999


def test_wrong_acceptance_rules_fail_the_same_test():
    assert chi_square(first_two_tokens(accept_always, point_mass=False, seed=1)) > 10 * CRITICAL_24DF_0999
    assert chi_square(first_two_tokens(no_residual, point_mass=False, seed=1)) > 2 * CRITICAL_24DF_0999
    assert chi_square(first_two_tokens(no_residual, point_mass=True, seed=2)) > 2 * CRITICAL_24DF_0999


def test_a_draft_equal_to_the_target_is_always_accepted_with_a_bonus_token():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        drafts = torch.multinomial(P, 3, replacement=True, generator=g).tolist()
        out = rejection_sample(P.expand(4, V), drafts, P.expand(3, V), g)
        assert out[:3] == drafts and len(out) == 4


def test_zero_target_probability_is_never_accepted_nor_emitted():
    p = torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0])
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        out = rejection_sample(p.expand(2, V), [0], None, g)
        assert len(out) == 1 and out[0] in (1, 2)


def test_same_generator_state_same_tokens():
    def run(seed):
        g = torch.Generator().manual_seed(seed)
        return [rejection_sample(P.expand(K + 1, V), [3, 3], Q.expand(K, V), g) for _ in range(50)]

    assert run(7) == run(7) and run(7) != run(8)


def test_greedy_accepts_while_target_agrees_then_emits_its_token():
    assert greedy_verify([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted + bonus
    assert greedy_verify([5, 9, 7, 8], [5, 6, 7]) == [5, 9]  # first mismatch: the target's token
    assert greedy_verify([4, 6, 7, 8], [5, 6, 7]) == [4]
    assert greedy_verify([4], []) == [4]  # no drafts: plain greedy
    for t, d in itertools.product([[1, 2, 3]], [[1, 2], [1, 0], [0, 2]]):
        out = greedy_verify(t, d)
        assert out == t[:len(out)]  # greedy output is always the target's own argmax run
