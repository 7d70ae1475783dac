"""Markdown building blocks shared by the report's sections."""
from __future__ import annotations

from typing import Any

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


def group(runs: Runs, rows: list[tuple[str, str, str]], empty: str | None = None) -> list[str]:
    """One table: a row per (level, metric), a column per engine that finished requests."""
    from experiments.report.rows import cell

    multi = len(runs.levels) > 1
    engines = [e for e in runs.engines if e.summary]
    if not engines:
        return ["No engine finished any request."]
    header = (["level"] if multi else []) + ["metric"] + [e.label for e in engines]
    body = []
    for level in runs.levels:
        for name, path, unit in rows:
            cells = [cell(e.summary[level], path, unit) if level in e.summary else "–" for e in engines]
            if all(c == "–" for c in cells):
                continue  # a metric no engine has at this level (e.g. cost without cost_per_hour)
            body.append(([level] if multi else []) + [name] + cells)
    if not body and empty:
        return [empty]
    return table(header, body)
