"""Routers (router.py) and the fleet loop (fleet.py) on the planted step-time model."""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from reference_engine import EngineConfig

from experiments.simulate import fleet
from reference_engine.engine import router
from experiments.simulate.replica import Replica
from experiments.simulate.step_model import ModelShape
from tests.experiments.simulate.planted import PER_SEQ, PER_STEP, planted


@dataclass
class Fake:
    outstanding: int
    kv: float = 0.0

    def kv_used_fraction(self) -> float:
        return self.kv


def test_round_robin_cycles_whatever_the_load():
    r = router.make("round_robin", 3)
    busy = [Fake(9), Fake(0), Fake(0)]
    assert [r.pick([1, 2], busy) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_least_loaded_picks_fewest_outstanding_then_least_kv():
    r = router.make("least_loaded", 3)
    assert r.pick([1], [Fake(2), Fake(1), Fake(1, 0.5)]) == 1
    assert r.pick([1], [Fake(2), Fake(1, 0.9), Fake(1, 0.5)]) == 2


def test_prefix_aware_keeps_a_prefix_on_its_replica_until_the_load_gap_is_too_wide():
    r = router.make("prefix_aware", 2, block_size=4)
    a = list(range(10, 30))
    assert r.pick(a + [1], [Fake(0), Fake(0)]) == 0
    assert r.pick(a + [2], [Fake(3), Fake(0)]) == 0  # same leading blocks: replica 0, though busier
    assert r.pick(list(range(50, 70)), [Fake(3), Fake(0)]) == 1  # a new prefix: least loaded
    assert r.pick(a + [3], [Fake(9), Fake(0)]) == 1  # beyond the slack: load wins


def replicas(model, n):
    return [Replica(EngineConfig(model=str(model), kv_cache_tokens=4096), 256, ModelShape.from_dir(model), planted(),
                    seed=i) for i in range(n)]


def test_fleet_times_one_request_exactly(exp_model):
    f = fleet.Fleet(replicas(exp_model, 1), router.make("round_robin", 1))
    done, wall = f.run([fleet.Arrival(0.5, "a", list(range(3, 35)), 4)])
    one = PER_STEP + PER_SEQ
    assert (done[0].first, done[0].last, done[0].tokens) == pytest.approx((0.5 + one, 0.5 + 4 * one, 4), abs=1e-12)
    assert wall == pytest.approx(4 * one, abs=1e-12)


def test_prefix_aware_routing_hits_the_cache_more_than_round_robin(exp_model):
    """Four groups of requests sharing 64-token prefixes on 4 replicas: prefix_aware keeps each group
    on one replica (its prefix computed once), round robin spreads every group over all four."""
    groups = [list(range(100 * g + 3, 100 * g + 67)) for g in range(4)]
    rng = random.Random(0)  # groups in random order: round robin cannot line up with them by chance
    arr = [fleet.Arrival(0.05 * i, f"q{i}", groups[rng.randrange(4)] + [5000 + i] * 8, 4) for i in range(64)]

    def hit_rate(name):
        f = fleet.Fleet(replicas(exp_model, 4), router.make(name, 4, 16))
        f.run(arr)
        return sum(s.prefix_hit_tokens for s in f.stats) / sum(s.prefix_query_tokens for s in f.stats)

    assert hit_rate("prefix_aware") > hit_rate("round_robin") + 0.05
