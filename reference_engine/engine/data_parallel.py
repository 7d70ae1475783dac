"""Data parallelism: N engine cores behind one front end, each request routed to one of them.

`DataParallelEngine` holds N `ProcessAsyncEngine`s, each a full copy of the model in its own core
process, pinned to its own share of this process's CPUs (a replica per core on a 2-core machine), and
puts each arriving request on the replica a router picks (router.py: round_robin, least_loaded,
prefix_aware, the same routers `inferlab simulate --replicas N --router R` models). vLLM's
`--data-parallel-size` with its internal load balancer is the same shape: one API server, N engine cores.
`inferlab serve --data-parallel-size N --router R` serves it; the harness maps `[parallel] data = N` to it.

It answers the `EngineClient` API the server uses: a request's stream is its replica's; an abort goes to
every replica (only the owner holds the request); counters and memory are summed over the replicas;
the facts (tokenizer, context length, model) are replica 0's, as every replica loads the same model.

Invariant: a request lives on exactly one replica from `add_request` to its end; a replica that dies
takes the server with it (`is_alive` is False as soon as any replica is dead), as vLLM's DP does.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import AsyncIterator, Callable

from reference_engine.config import EngineConfig
from reference_engine.engine.client import RequestStream
from reference_engine.engine.engine_process import ProcessAsyncEngine
from reference_engine.engine.messages import EngineStats
from reference_engine.engine.router import make as make_router
from reference_engine.outputs import TokenDelta
from reference_engine.sampling_params import SamplingParams


def split_cpus(n: int, cpus: list[int] | None = None) -> list[tuple[int, ...]]:
    """This process's CPUs in `n` contiguous groups as even as can be (ValueError with fewer CPUs than n)."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cpus) < n:
        raise ValueError(f"data_parallel_size {n} needs at least {n} CPUs; this process may use {len(cpus)}")
    k, r = divmod(len(cpus), n)
    out, i = [], 0
    for j in range(n):
        m = k + (j < r)
        out.append(tuple(cpus[i:i + m]))
        i += m
    return out


class _Load:
    """What a router reads of a replica: requests outstanding and KV in use, after its core's last turn."""

    def __init__(self, engine: ProcessAsyncEngine):
        self.engine = engine

    @property
    def outstanding(self) -> int:
        s = self.engine.stats()
        return s.num_running + s.num_waiting

    def kv_used_fraction(self) -> float:
        return self.engine.stats().kv_usage


class DataParallelEngine:
    """N replicas behind one front end (module docstring)."""

    def __init__(self, config: EngineConfig, size: int, router: str = "least_loaded",
                 step_timeout: float | None = None, on_death: Callable[[str], None] | None = None):
        if size < 2:
            raise ValueError(f"data_parallel_size must be >= 2 for DataParallelEngine, got {size}")
        groups = split_cpus(size)
        self.router_name, self.router = router, make_router(router, size, config.block_size)
        self.replicas = [ProcessAsyncEngine(dataclasses.replace(config, num_threads=config.num_threads or len(g)),
                                            step_timeout, on_death, cpus=g) for g in groups]
        self.config = config
        self._loads = [_Load(r) for r in self.replicas]

    # ---- life ---------------------------------------------------------------------------
    @property
    def on_death(self):
        return self.replicas[0].on_death

    @on_death.setter
    def on_death(self, fn) -> None:
        for r in self.replicas:
            r.on_death = fn

    async def start(self) -> "DataParallelEngine":
        try:
            for r in self.replicas:  # one at a time: each loads the model, and a failed one stops the rest
                await r.start()
        except BaseException:
            await self.shutdown()
            raise
        self.config = self.replicas[0].config
        return self

    def abort_start(self) -> None:
        for r in self.replicas:
            r.abort_start()

    async def shutdown(self) -> None:
        await asyncio.gather(*(r.shutdown() for r in self.replicas))

    @property
    def is_alive(self) -> bool:
        return all(r.is_alive for r in self.replicas)

    # ---- facts (replica 0's: every replica loads the same model) -------------------------
    @property
    def tokenizer(self):
        return self.replicas[0].tokenizer

    @property
    def max_model_len(self) -> int:
        return self.replicas[0].max_model_len

    @property
    def model_config(self):
        return self.replicas[0].model_config

    @property
    def model_name(self) -> str:
        return self.replicas[0].model_name

    @property
    def version(self) -> str:
        return self.replicas[0].version

    @property
    def core_pids(self) -> list[int | None]:
        return [r.core_pid for r in self.replicas]

    def effective_config(self) -> dict:
        e = self.replicas[0].effective_config()
        return {**e, "data_parallel_size": len(self.replicas), "router": self.router_name,
                "kv_capacity_tokens": e["kv_capacity_tokens"] * len(self.replicas),
                "replica_cpus": [list(r.cpus) for r in self.replicas]}

    def stats(self) -> EngineStats:
        """Every counter summed over the replicas (per-position lists element-wise); usage over all blocks."""
        parts = [r.stats() for r in self.replicas]
        out = {}
        for f in dataclasses.fields(EngineStats):
            vals = [getattr(p, f.name) for p in parts]
            if f.name == "block_size":
                out[f.name] = vals[0]
            elif isinstance(vals[0], list):
                out[f.name] = [sum(x) for x in zip(*vals)] if vals[0] else []
            else:
                out[f.name] = sum(vals)
        out["kv_usage"] = out["kv_used_blocks"] / max(1, out["kv_total_blocks"])
        return EngineStats(**out)

    async def memory_report(self) -> dict[str, int]:
        """Bytes summed over the replicas (each holds a full copy of the weights and its own KV cache)."""
        reports = await asyncio.gather(*(r.memory_report() for r in self.replicas))
        out: dict[str, int] = {}
        for rep in reports:
            for k, v in rep.items():
                out[k] = out.get(k, 0) + v if k != "kv_bytes_per_token" else v
        return out

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        done = await asyncio.gather(*(r.reset_prefix_cache(reset_running_requests) for r in self.replicas))
        return all(done)

    # ---- requests -------------------------------------------------------------------------
    def pick(self, prompt_token_ids: list[int]) -> int:
        return self.router.pick(prompt_token_ids, self._loads)

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams,
                    request_id: str | None = None, cache_salt: str | None = None) -> RequestStream:
        if request_id is not None and any(r.holds(request_id) for r in self.replicas):
            raise ValueError(f"request id {request_id!r} is already in use")
        return self.replicas[self.pick(list(prompt_token_ids))].add_request(prompt_token_ids, params, request_id,
                                                                              cache_salt)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams,
                       request_id: str | None = None, cache_salt: str | None = None) -> AsyncIterator[TokenDelta]:
        replica = self.replicas[self.pick(list(prompt_token_ids))]
        async for d in replica.generate(prompt_token_ids, params, request_id, cache_salt):
            yield d

    def abort(self, request_id: str) -> None:
        for r in self.replicas:  # a no-op on every replica but the owner
            r.abort(request_id)
