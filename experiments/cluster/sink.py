"""The driver-side actor the tasks stream to: every finished request's record as it finishes, each finished level
with its manifest, and each task's start (which node took it). It runs on the driver's node (so a worker node
dying takes none of it) and holds what arrived until the driver takes it.

Records are keyed by request id: (pair, attempt, repeat, level, request id) is kept once, so a message delivered
twice is counted, never written twice; across attempts the driver decides (driver.py keeps the finished levels'
records and drops an interrupted level's whole).
"""
from __future__ import annotations

from typing import Any


class RecordSink:
    def __init__(self) -> None:
        self.queue: list[tuple[str, int, str, Any]] = []
        self.seen: set[tuple[str, int, int, str, str]] = set()
        self.duplicates = 0

    def put(self, key: str, attempt: int, kind: str, data: Any) -> None:
        if kind == "record":
            rid = (key, attempt, int(data.get("repeat", 1)), str(data["level"]), str(data["request_id"]))
            if rid in self.seen:
                self.duplicates += 1
                return
            self.seen.add(rid)
        self.queue.append((key, attempt, kind, data))

    def take(self) -> list[tuple[str, int, str, Any]]:
        out, self.queue = self.queue, []
        return out

    def stats(self) -> dict[str, int]:
        return {"records": len(self.seen), "duplicates": self.duplicates}


def start() -> Any:
    """The actor, pinned to the driver's node, asking for no CPU (it only holds messages)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return ray.remote(RecordSink).options(
        num_cpus=0, max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
