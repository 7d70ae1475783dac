"""`[load] clients = K` on a cluster: one open-loop level's arrivals sent by K client processes (Ray actors).

The level's schedule is the one a single client would follow (`load.arrivals`: same seed, rate, burstiness and
chains); chain i goes to client i mod K with its own offset, so the union of the clients' sends is that schedule and
every prompt is the same token ids. Each client attaches to the engine's server (its URL: the engine must run as a
server) and starts at one wall-clock time, the barrier, which the task sets a moment ahead. Before that the task
measures each client's clock against its own (the midpoint of a few round trips; the offset and the round trip are
recorded), and every timestamp a client returns is moved onto the task's clock (client monotonic -> client wall ->
task wall -> task monotonic), so merged records compare as one client's would. Each client's lateness (send
against due, p99) is recorded per level, with `client_bound` where it passes `[load.sweep] client_lateness_ms`.
Clients sit on the task's node unless the engine listens beyond it (`[engine_options.X] host = "0.0.0.0"`): then
Ray spreads them over the cluster and they reach the engine at its node's IP.
"""
from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any, Callable

BARRIER_S = 1.0  # the start is this far ahead of the moment every client is ready
PINGS = 5
TIMES = ("send_ns", "due_ns", "sent_ns", "headers_ns", "done_ns")


class Client:
    """One client process: attaches to the engine and sends its share of a level at the barrier."""

    def clock(self) -> int:
        return time.time_ns()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    async def attach(self, spec: dict[str, Any]) -> None:
        """Attach to the engine's server before the barrier is set, so that no client spends the barrier's
        margin (or more) starting its adapter."""
        from adapters import registry

        self.engine = registry.create(spec["adapter"], spec["model"], spec["dtype"], {"url": spec["url"]})
        await self.engine.start()

    async def send(self, spec: dict[str, Any], chains: list, offsets: list[float], start_wall_ns: int,
                   cap: int | None) -> dict[str, Any]:
        from experiments.running.load import LoadGenerator
        from experiments.running.results import record

        engine = self.engine
        out: list[dict[str, Any]] = []
        arrival = {c[0].request_id: at for c, at in zip(chains, offsets)}  # a chain's first turn: its scheduled offset

        def done(o: Any) -> None:
            if o.ok:
                out.append({**record(o, spec["level"], spec["session"], spec["repeat"]), "client": spec["client"],
                            "arrival_s": arrival.get(o.item.request_id)})

        gen = LoadGenerator(engine, spec["sampling"], done, spec["timeout_s"])
        wall_minus_mono = time.time_ns() - time.perf_counter_ns()
        await asyncio.sleep(max(0.0, (start_wall_ns - time.time_ns()) / 1e9))  # the barrier
        # A client that reached the barrier late keeps the schedule: each arrival stays due at barrier + offset
        # (sent at once when that has passed, and counted late), never shifted to the client's own start.
        late = max(0.0, (time.time_ns() - start_wall_ns) / 1e9)
        await gen.open(chains, [o - late for o in offsets], cap)
        return {"records": out, "failure": gen.failure, "wall_minus_mono": wall_minus_mono}

    async def detach(self) -> None:
        engine, self.engine = getattr(self, "engine", None), None
        if engine is not None:
            await engine.stop()


def engine_url(engine: Any) -> str | None:
    """The base URL of the engine's server (attached or launched), None for an in-process engine."""
    return getattr(engine, "url", None) or getattr(getattr(engine, "server", None), "base_url", None)


class Clients:
    """The task's side (`Plan.clients`): K actors made once per task, reused by every level."""

    def __init__(self, cfg: Any, name: str, on_level: Callable[[str, int, list[dict[str, Any]]], None]):
        self.cfg, self.name, self.on_level = cfg, name, on_level
        self.actors: list[Any] = []

    def _start(self, url: str) -> str:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts = self.cfg.engine_options.get(self.name, {})
        here = ray.get_runtime_context().get_node_id()
        spread = opts.get("host") == "0.0.0.0"
        strategy = "SPREAD" if spread else NodeAffinitySchedulingStrategy(here, soft=False)
        env = {"env_vars": dict(self.cfg.cluster.client_env)} if self.cfg.cluster.client_env else None
        self.actors = [ray.remote(Client).options(num_cpus=0, max_restarts=0, scheduling_strategy=strategy,
                                                  runtime_env=env).remote() for _ in range(self.cfg.load.clients)]
        return url.replace("127.0.0.1", ray.util.get_node_ip_address()) if spread else url

    async def offset(self, actor: Any) -> tuple[int, int]:
        """(client wall - task wall, round trip), ns: the round trip's midpoint, best of PINGS."""
        best = None
        for _ in range(PINGS):
            t0 = time.time_ns()
            c = await actor.clock.remote()
            t1 = time.time_ns()
            if best is None or t1 - t0 < best[1]:
                best = (c - (t0 + t1) // 2, t1 - t0)
        return best

    async def __call__(self, er: Any, engine: Any, todo: list, offsets: list[float], cap: int | None,
                       keep: Callable[[dict[str, Any]], None], level: str) -> str | None:
        url = engine_url(engine)
        if url is None:
            return "load.clients needs the engine behind a server ([engine_options.X] mode = \"server\")"
        if not self.actors:
            url = self._start(url)
        self.url = getattr(self, "url", None) or url
        k = len(self.actors)
        clocks = [await self.offset(a) for a in self.actors]
        nodes = await asyncio.gather(*(a.node.remote() for a in self.actors))
        base = {"adapter": self.cfg.adapter(self.name), "model": str(self.cfg.model), "dtype": self.cfg.dtype,
                "url": self.url, "sampling": self.cfg.sampling.model_dump(), "timeout_s": self.cfg.load.timeout_s,
                "level": level, "session": er.session, "repeat": er.repeat}
        per_cap = -(-cap // k) if cap else None
        await asyncio.gather(*(a.attach.remote({**base, "client": i}) for i, a in enumerate(self.actors)))
        start = time.time_ns() + int(BARRIER_S * 1e9)  # every client is attached: the barrier only covers the calls
        try:
            refs = [a.send.remote({**base, "client": i}, todo[i::k], offsets[i::k], start + clocks[i][0], per_cap)
                    for i, a in enumerate(self.actors)]
            results = await asyncio.gather(*refs)
        finally:
            await asyncio.gather(*(a.detach.remote() for a in self.actors), return_exceptions=True)
        task_wmm = time.time_ns() - time.perf_counter_ns()
        from experiments.measuring import metrics

        summary = []
        for i, res in enumerate(results):
            shift = res["wall_minus_mono"] - clocks[i][0] - task_wmm  # client monotonic -> task monotonic
            for rec in res["records"]:
                for t in TIMES:
                    if rec.get(t) is not None:
                        rec[t] += shift
                rec["events"] = [[ns + shift, n] for ns, n in rec["events"]]
                keep(rec)
            late = metrics.stats(metrics.lateness_ms(res["records"]))
            summary.append({"client": i, "node_id": nodes[i], "clock_offset_ms": clocks[i][0] / 1e6,
                            "rtt_ms": clocks[i][1] / 1e6, "sent": len(todo[i::k]), "lateness_p99_ms": late["p99"],
                            "client_bound": late["p99"] is not None
                            and late["p99"] > self.cfg.load.sweep.client_lateness_ms})
        self.on_level(level, er.repeat, summary)
        return next((r["failure"] for r in results if r["failure"]), None)
