"""`[parallel] tensor = T, pipeline = P, data = D`: one config block, each engine's own flags.

The harness passes the block to every adapter as the option `parallel = {tensor, pipeline, data}`;
`Engine.__init__` (adapters/base.py) replaces it with the engine's own options before the adapter
reads them, so each adapter renders them as it renders any of its knobs. Sizes of 1 are the
engines' defaults and map to nothing. What an engine cannot do is refused in one line (a config
error), never dropped. Each engine's spec (`EngineSpec.parallel`, in its folder under
adapters/engines/) maps the dimensions it runs to its own options, citing the flag definitions
upstream; `parallel_why` says why the others are refused.

GPUs: an engine uses tensor x pipeline x data devices; one replica (a full copy of the model) uses
tensor x pipeline (`gpus`).
"""
from __future__ import annotations

from typing import Any

KEYS = ("tensor", "pipeline", "data")


def parse(engine: str, raw: Any) -> dict[str, int]:
    """The block, checked: {tensor, pipeline, data}, each a positive integer (default 1)."""
    if not isinstance(raw, dict):
        raise ValueError(f"engine {engine!r}: parallel must be a table, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ValueError(f"engine {engine!r}: parallel: unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}")
    out = {k: raw.get(k, 1) for k in KEYS}
    for k, v in out.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"engine {engine!r}: parallel.{k} must be a positive integer, got {v!r}")
    return out


def to_native(spec: Any, options: dict[str, Any]) -> dict[str, Any]:
    """`options` with `parallel` replaced by the options `spec` (an EngineSpec) names; ValueError (one line)
    for a dimension the engine cannot run, or a native option that says otherwise."""
    if "parallel" not in options or spec is None:
        return options  # a wrapper (experiments' Isolated) hands it on to the adapter it runs
    engine, out = spec.name, dict(options)
    par = parse(engine, out.pop("parallel"))
    native = spec.parallel
    for dim, n in par.items():
        if n == 1 and dim not in native:
            continue
        if dim not in native:
            raise ValueError(f"engine {engine!r}: [parallel] {dim} = {n} is not supported "
                             f"({spec.parallel_why})")
        key = native[dim]
        if out.get(key) is not None and out[key] != n:
            raise ValueError(f"engine {engine!r}: [parallel] {dim} = {n} but option {key} = {out[key]!r}; set one")
        if n > 1 or key in out:
            out[key] = n
    return out


def gpus(effective: dict[str, Any]) -> tuple[int | None, int | None]:
    """(GPUs per engine, GPUs per replica) from read-back sizes (missing sizes count as 1; None
    when the engine reports no tensor-parallel size at all)."""
    t = effective.get("tensor_parallel_size")
    if t is None:
        return None, None
    per_replica = int(t) * int(effective.get("pipeline_parallel_size") or 1)
    return per_replica * int(effective.get("data_parallel_size") or 1), per_replica
