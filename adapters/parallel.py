"""`[parallel] tensor = T, pipeline = P, data = D`: one config block, each engine's own flags.

The harness passes the block to every adapter as the option `parallel = {tensor, pipeline, data}`;
`Engine.__init__` (adapters/base.py) replaces it with the engine's own options before the adapter
reads them, so each adapter renders them as it renders any of its knobs. Sizes of 1 are the
engines' defaults and map to nothing. What an engine cannot do is refused in one line (a config
error), never dropped:

| engine | tensor | pipeline | data | source (flag definitions) |
|---|---|---|---|---|
| vllm | --tensor-parallel-size | --pipeline-parallel-size | --data-parallel-size | vllm/engine/arg_utils.py, vLLM 0.32.0 (installed in .venv-vllm) |
| sglang | --tp-size | --pp-size | --dp-size | sglang/srt/server_args.py, SGLang 0.5.23 (parsed by its own parser: tests/adapters/sglang_contract.py) |
| trtllm | --tp_size | --pp_size | refused | tensorrt_llm/commands/serve.py @ 00209af149e7774406881a37283dce303571eb11 (aliases of --tensor_parallel_size / --pipeline_parallel_size; no data-parallel flag) |
| tgi | --num-shard | refused | refused | launcher/src/main.rs @ v3.3.7 (`num_shard`: tensor-parallel shards; no pipeline or replica option) |
| reference | tensor_parallel_size | refused | refused | reference_engine/distributed/ |
| hf, openai | refused | refused | refused | one process / a server attached as it was started |

GPUs: an engine uses tensor x pipeline x data devices; one replica (a full copy of the model) uses
tensor x pipeline (`gpus`).
"""
from __future__ import annotations

from typing import Any

KEYS = ("tensor", "pipeline", "data")
# engine -> {dimension: the engine's own option (adapters render options as flags)}
NATIVE: dict[str, dict[str, str]] = {
    "vllm": {"tensor": "tensor_parallel_size", "pipeline": "pipeline_parallel_size", "data": "data_parallel_size"},
    "sglang": {"tensor": "tp_size", "pipeline": "pp_size", "data": "dp_size"},
    "trtllm": {"tensor": "tp_size", "pipeline": "pp_size"},
    "tgi": {"tensor": "num_shard"},
    "reference": {"tensor": "tensor_parallel_size"},
}
WHY = {"trtllm": "trtllm-serve has no data-parallel option (run replicas behind a router)",
       "tgi": "TGI shards tensors only (--num-shard); run replicas behind a router for data parallelism",
       "reference": "the reference engine does tensor parallelism only",
       "hf": "the HF baseline runs one process on one device",
       "openai": "an attached server's parallelism was fixed when it started"}


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


def to_native(engine: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` with `parallel` replaced by the engine's own options; ValueError (one line) for a
    dimension the engine cannot run, or a native option that says otherwise."""
    if "parallel" not in options or (engine not in NATIVE and engine not in WHY):
        return options  # a wrapper (experiments/isolate.py's Isolated) hands it on to the adapter it runs
    out = dict(options)
    par = parse(engine, out.pop("parallel"))
    native = NATIVE.get(engine, {})
    for dim, n in par.items():
        if n == 1 and dim not in native:
            continue
        if dim not in native:
            raise ValueError(f"engine {engine!r}: [parallel] {dim} = {n} is not supported "
                             f"({WHY.get(engine, 'no such option')})")
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
