"""The frontier: throughput per device against interactivity, the way engines are compared at scale.

Each measured level of each cell is a point: x = interactivity, the output tokens per second one user
sees (1000 / TPOT p50 in ms, SemiAnalysis InferenceX's definition), y = output tokens per second per
device (per GPU used, tensor x pipeline x data; on a CPU per core of the engine process's affinity
mask). An engine's frontier is its Pareto-optimal set over every cell and level: a point is on it
unless another point of that engine is at least as interactive and at least as productive, and
strictly more of one. Reading an engine at a target interactivity interpolates linearly between the
two frontier points around it (with its interval, interpolated the same way); a target outside the
points' range is said to be outside, never extrapolated. Everything here is pure: tests plant points.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Point:
    engine: str  # the label in the report (an engine, a variant, or a simulated one)
    cell: str | None  # the matrix cell, None for a plain config
    level: str  # e.g. "concurrency=8"
    interactivity: float  # output tok/s per user: 1000 / TPOT p50 (ms)
    output: float  # output tok/s per device
    total: float | None = None  # input + output tok/s per device
    output_ci: tuple[float, float] | None = None  # 95 % interval of `output`
    ci_basis: str | None = None  # "repeats" or "windows" (per-window throughput inside the level)
    extra: dict[str, Any] = field(default_factory=dict)  # TTFT, devices, machine, cost, energy, hardware

    @property
    def name(self) -> str:
        return f"{self.cell}/{self.level}" if self.cell else self.level


def interactivity(tpot_p50_ms: float | None) -> float | None:
    """Output tokens per second per user at this TPOT (ms)."""
    return 1000.0 / tpot_p50_ms if tpot_p50_ms and tpot_p50_ms > 0 else None


def dominated(p: Point, q: Point) -> bool:
    """Whether q dominates p: at least as good on both axes, better on one."""
    return (q.interactivity >= p.interactivity and q.output >= p.output
            and (q.interactivity > p.interactivity or q.output > p.output))


def pareto(points: list[Point]) -> list[Point]:
    """The points no other dominates, by interactivity ascending (so output descending). Ties (the same x and
    y twice) both stay: neither dominates the other."""
    keep = [p for p in points if not any(dominated(p, q) for q in points if q is not p)]
    return sorted(keep, key=lambda p: (p.interactivity, -p.output))


def frontiers(points: list[Point]) -> dict[str, list[Point]]:
    """engine label -> its frontier."""
    by: dict[str, list[Point]] = {}
    for p in points:
        by.setdefault(p.engine, []).append(p)
    return {e: pareto(ps) for e, ps in by.items()}


@dataclass
class Read:
    """One engine read at one target interactivity."""

    target: float
    output: float | None = None  # tok/s per device; None: outside the measured range
    ci: tuple[float, float] | None = None
    between: tuple[str, str] | None = None  # the frontier points it lies between (names)
    why: str = ""  # why there is no value


def read_at(front: list[Point], target: float) -> Read:
    """The frontier's output per device at `target` tok/s per user, linearly between its neighbours."""
    if not front:
        return Read(target, why="no frontier point")
    xs = [p.interactivity for p in front]
    if target < xs[0] or target > xs[-1]:
        return Read(target, why=f"outside the measured range ({xs[0]:.1f}-{xs[-1]:.1f} tok/s per user): "
                                f"not extrapolated")
    for a, b in zip(front, front[1:] + front[-1:]):
        if a.interactivity <= target <= b.interactivity:
            break
    if b.interactivity == a.interactivity:  # on a point (or a tie): the better of the points at that x
        best = max((p for p in front if p.interactivity == target), key=lambda p: p.output, default=a)
        return Read(target, best.output, best.output_ci, (best.name, best.name))
    w = (target - a.interactivity) / (b.interactivity - a.interactivity)
    out = a.output + w * (b.output - a.output)
    ci = None
    if a.output_ci and b.output_ci:
        ci = (a.output_ci[0] + w * (b.output_ci[0] - a.output_ci[0]), a.output_ci[1] + w * (b.output_ci[1] - a.output_ci[1]))
    return Read(target, out, ci, (a.name, b.name))


def cost_per_m(output_per_device: float | None, price_per_device_hour: float | None) -> float | None:
    """Dollars per million output tokens: one device's hourly price over its output tokens per hour."""
    if not output_per_device or price_per_device_hour is None:
        return None
    return price_per_device_hour / (output_per_device * 3600) * 1e6
