"""How far from the hardware: an *estimate* of the memory bandwidth a decode step achieves,
beside the machine's peak measured in the same run.

    bytes per decode step = weight bytes (every weight read once)
                          + running sequences x mean context tokens x KV bytes per token
    achieved bandwidth    = bytes per decode step / TPOT (median, seconds)

KV bytes per token = 2 (K and V) x layers x KV heads x head dim x dtype bytes, from the
model's config.json; weight bytes = parameter count (from the safetensors headers) x dtype
bytes. It ignores activations, the sampler, and launch overheads, so it is a lower bound on
what the step really moved and an upper bound on how efficient the step was.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from adapters.common.model_shape import DTYPE_BYTES, model_shape, param_count  # noqa: F401 (re-exported)

FORMULA = ("achieved GB/s = (weight bytes + running seqs x mean context x KV bytes/token) / median TPOT; "
           "KV bytes/token = 2 x layers x kv_heads x head_dim x dtype bytes")


def decode_estimate(shape: dict[str, Any], tpot_ms: float | None, running: float | None,
                    mean_context: float) -> dict[str, Any]:
    """Bytes per decode step and achieved GB/s; None when TPOT is unknown."""
    running = running or 1.0
    step_bytes = shape["weight_bytes"] + running * mean_context * shape["kv_bytes_per_token"]
    gbps = step_bytes / (tpot_ms / 1e3) / 1e9 if tpot_ms else None
    return {"step_bytes": step_bytes, "running_seqs": running, "mean_context": mean_context,
            "tpot_ms": tpot_ms, "achieved_gbps": gbps}


def peak_copy_gbps(size_mb: int = 128, repeats: int = 10) -> dict[str, Any]:
    """Measured peak: best-of-N large copy (bytes read + bytes written) / time, on the CPU with
    numpy and, when torch sees a GPU, on the GPU with torch.

    On the CPU the copy runs on one thread and split across every core (a decode step's GEMMs
    read the weights from all of the engine's threads), after one untimed copy so that no
    page fault is timed; `cpu_gbps` is the best of both. One copy measured once read 13 to 38
    GB/s across three cells of one quiet run (docs/perf/cpu_vs_vllm.md): a single sample on a
    shared host is mostly noise, so the best of `repeats` is kept, as STREAM does."""
    n = size_mb * (1 << 20) // 8
    src, dst = np.ones(n), np.empty(n)
    np.copyto(dst, src)  # fault both buffers in, untimed
    cores = os.cpu_count() or 1
    best = {k: min(_timed(lambda: _copy(dst, src, k)) for _ in range(repeats)) for k in sorted({1, cores})}
    gbps = {k: 2 * src.nbytes / t / 1e9 for k, t in best.items()}
    out: dict[str, Any] = {"cpu_gbps": max(gbps.values()), "cpu_gbps_1_thread": gbps[1], "cpu_threads": cores,
                           f"cpu_gbps_{cores}_threads": gbps[cores], "size_mb": size_mb, "repeats": repeats,
                           "gpu_gbps": None}
    del src, dst
    if not Path("/dev/nvidia0").exists() and "torch" not in sys.modules:
        return out  # no GPU here: do not pay for importing torch
    try:
        import torch

        if torch.cuda.is_available():
            a = torch.ones(n, device="cuda", dtype=torch.float64)
            b = torch.empty_like(a)

            def copy() -> None:
                b.copy_(a)
                torch.cuda.synchronize()

            copy()
            out["gpu_gbps"] = 2 * a.numel() * 8 / min(_timed(copy) for _ in range(repeats)) / 1e9
            del a, b
    except Exception:  # no torch / no GPU: CPU peak only
        pass
    return out


def best_of(kept: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Two peak readings of one run as one: the faster reading's fields, and every reading's CPU
    GB/s under `readings`. The harness reads the peak again before each engine of a cell (the
    machine's bandwidth moved from 27 to 49 GB/s between cells of one quiet run): the best reading is
    what the hardware can do, and every engine's floor is divided by that one."""
    readings = [*(kept.get("readings") or [kept.get("cpu_gbps")]), *(new.get("readings") or [new.get("cpu_gbps")])]
    out = dict(new if (new.get("cpu_gbps") or 0) > (kept.get("cpu_gbps") or 0) else kept)
    gpus = [g for g in (kept.get("gpu_gbps"), new.get("gpu_gbps")) if g]
    out["gpu_gbps"] = max(gpus) if gpus else None
    out["readings"] = [r for r in readings if r is not None]
    return out


def _copy(dst: np.ndarray, src: np.ndarray, threads: int) -> None:
    """dst[:] = src in `threads` equal slices at once (numpy releases the GIL while it copies)."""
    if threads == 1:
        np.copyto(dst, src)
        return
    cuts = np.linspace(0, len(src), threads + 1).astype(int)
    workers = [threading.Thread(target=np.copyto, args=(dst[a:b], src[a:b])) for a, b in zip(cuts, cuts[1:])]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
