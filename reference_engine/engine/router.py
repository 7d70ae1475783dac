"""Routers in front of N replicas: which replica gets an arriving request. One definition for the real
engine (`inferlab serve --data-parallel-size N --router R`, data_parallel.py) and the simulator
(`inferlab simulate --replicas N --router R`, experiments/simulate/fleet.py), so a measured fleet and a
simulated one route alike.

- round_robin: replica i mod N, whatever their load.
- least_loaded: the replica with the fewest outstanding requests (running + waiting), ties to the
  one with the least KV in use, then the lowest index.
- prefix_aware: the replica that last served the longest run of this prompt's leading blocks (the
  blocks a prefix cache would hit), unless it holds more than `slack` outstanding requests above the
  least loaded one; otherwise, and for prompts never seen, least_loaded. This is the trade every
  prefix-aware router makes: cache hits against load balance.

Invariant: a router is deterministic: the same arrivals and replica states give the same choices.
"""
from __future__ import annotations

import hashlib
from typing import Protocol, Sequence


class Load(Protocol):
    @property
    def outstanding(self) -> int: ...

    def kv_used_fraction(self) -> float: ...


class Router:
    name = "round_robin"

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def pick(self, prompt: Sequence[int], replicas: Sequence[Load]) -> int:
        self.i += 1
        return (self.i - 1) % self.n


class LeastLoaded(Router):
    name = "least_loaded"

    def pick(self, prompt: Sequence[int], replicas: Sequence[Load]) -> int:
        return min(range(self.n), key=lambda i: (replicas[i].outstanding, replicas[i].kv_used_fraction(), i))


class PrefixAware(LeastLoaded):
    name = "prefix_aware"

    def __init__(self, n: int, block_size: int = 16, max_blocks: int = 32, slack: int = 4) -> None:
        super().__init__(n)
        self.block_size, self.max_blocks, self.slack = block_size, max_blocks, slack
        self.owner: dict[bytes, int] = {}  # chain hash of a leading run of blocks -> replica that last had it

    def _chain(self, prompt: Sequence[int]) -> list[bytes]:
        out, h, bs = [], b"", self.block_size
        for k in range(min(len(prompt) // bs, self.max_blocks)):
            h = hashlib.blake2b(h + repr(tuple(prompt[k * bs:(k + 1) * bs])).encode(), digest_size=12).digest()
            out.append(h)
        return out

    def pick(self, prompt: Sequence[int], replicas: Sequence[Load]) -> int:
        chain = self._chain(prompt)
        least = super().pick(prompt, replicas)
        best = next((self.owner[h] for h in reversed(chain) if h in self.owner), None)
        if best is None or replicas[best].outstanding > replicas[least].outstanding + self.slack:
            best = least
        for h in chain:
            self.owner[h] = best
        return best


ROUTERS = {r.name: r for r in (Router, LeastLoaded, PrefixAware)}


def make(name: str, n: int, block_size: int = 16) -> Router:
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    return PrefixAware(n, block_size) if name == "prefix_aware" else ROUTERS[name](n)
