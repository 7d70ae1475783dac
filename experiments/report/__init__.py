"""report.md: the side-by-side comparison of every engine in one or more run folders.

Invariant: the report states the config, the fairness rules and the metric definitions it
was computed under, and flags every row an engine could not make fair (KV not pinned, a
setting the engine could not honour, engine inside the harness's interpreter, requests
that stopped before max_tokens, token-count mismatches, a client view that disagrees with
the engine's own).

`build` lives in build.py; the sections in their own modules (md: table helpers, rows: the
metric rows, sections: provenance/engines/flags/agreement, observer: client vs server).
"""
from experiments.report.build import build

__all__ = ["build"]
