"""Markdown building blocks shared by the report's sections."""
from __future__ import annotations

from typing import Any, Callable

from experiments.summary import Runs


def fmt(v: Any, digits: int = 2) -> str:
    if v is None or v != v:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def mib(v: Any) -> str:
    return "–" if v is None or v != v else f"{v / 2**20:,.1f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def group(runs: Runs, rows: list[tuple[str, Callable[[dict], Any]]]) -> list[str]:
    """One table: a row per (level, metric), a column per engine that finished requests."""
    multi = len(runs.levels) > 1
    engines = [e for e in runs.engines if e.summary]
    if not engines:
        return ["No engine finished any request."]
    header = (["level"] if multi else []) + ["metric"] + [e.label for e in engines]
    body = []
    for level in runs.levels:
        for name, get in rows:
            cells = []
            for e in engines:
                s = e.summary.get(level)
                cells.append(get(s) if s else "–")
            body.append(([level] if multi else []) + [name] + cells)
    return table(header, body)
