"""Markdown building blocks shared by the report's sections (imports nothing of the report)."""
from __future__ import annotations

from typing import Any


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
