"""The compute ceiling beside the bandwidth one, measured in the same run.

Prefill is compute-bound and decode bandwidth-bound, so each level gets two fractions:

    prefill FLOP/s (achieved) = 2 x P x mean prompt tokens / median TTFT
    compute ceiling           = best FLOP/s of the model's own projection matmuls
                                ([256 tokens x hidden] @ [hidden x (q+k+v), hidden, 2 x intermediate,
                                intermediate]) in the run's dtype on the run's device, through
                                each GEMM library engines use there (CPU: MKL's matmul and oneDNN's
                                prepacked linear, as vLLM-CPU and the reference engine call it; on an
                                AMD EPYC with AVX-512 the two differed 2.3x) — the best one counts
    decode GB/s (achieved)    = experiments/measuring/bandwidth.py, against the measured copy bandwidth
    bandwidth floor (ms)      = bytes per decode step / copy bandwidth (read + write, the same run's);
                                TPOT ÷ floor is how many floors one output token took

P is the non-embedding parameter count (the matmul weights every token passes through).
TTFT includes queueing and the first decode, so under concurrency the prefill figure is a
lower bound. The ceiling is measured in a child process (torch, all cores) before any
engine starts, so neither its threads nor its import touch a measured level.
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TOKENS = 256  # rows of the measured matmuls: a typical prefill chunk


def linear_shapes(cfg: dict[str, Any]) -> list[tuple[int, int]]:
    """(in, out) of one layer's projections, from an HF config.json."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d = cfg.get("head_dim") or h // heads
    kv = cfg.get("num_key_value_heads") or heads
    i = cfg["intermediate_size"]
    return [(h, (heads + 2 * kv) * d), (heads * d, h), (h, 2 * i), (i, h)]


def non_embedding_params(model_dir: str | Path) -> int:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return cfg["num_hidden_layers"] * sum(a * b for a, b in linear_shapes(cfg))


def measure(model_dir: str, dtype: str, repeats: int = 3) -> dict[str, Any]:
    """Run in the child: best-of-N FLOP/s over one layer's projection matmuls."""
    import torch

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    mats = [(torch.randn(TOKENS, a, device=dev, dtype=dt), torch.randn(a, b, device=dev, dtype=dt))
            for a, b in linear_shapes(cfg)]
    flops = sum(2 * TOKENS * w.shape[0] * w.shape[1] for _, w in mats)

    def timed(mm) -> float:
        def once(n: int) -> float:
            if dev == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                for x, w in mats:
                    mm(x, w)
            if dev == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t

        n = 1
        while once(n) < 0.05 and n < 1 << 16:  # warm-up, and enough calls that one timing is >= 50 ms
            n *= 2
        return min(once(n) for _ in range(repeats)) / n

    libraries = {"matmul": lambda x, w: x @ w}
    if dev == "cpu" and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        try:
            packed = {id(w): torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous()) for _, w in mats}
            libraries["onednn"] = lambda x, w: torch.ops.mkldnn._linear_pointwise(x, packed[id(w)], None, "none", [], "")
            libraries["onednn"](*mats[0])
        except RuntimeError:  # this dtype has no oneDNN kernel on this CPU
            libraries.pop("onednn")
    gflops = {name: flops / timed(mm) / 1e9 for name, mm in libraries.items()}
    best = max(gflops, key=gflops.get)
    return {"gflops": gflops[best], "library": best, "by_library": gflops, "device": dev, "dtype": dtype,
            "threads": torch.get_num_threads(), "shapes": [[TOKENS, a, b] for a, b in linear_shapes(cfg)]}


def compute_peak(model_dir: str, dtype: str, timeout_s: float = 120) -> dict[str, Any]:
    """The ceiling, measured in a child process; {} (with the reason) when it cannot be.
    Once per (model, dtype) and process: `inferlab run` measures it once per run, and a
    process that runs several configs (the test suite) does not pay ~3 s for each."""
    return dict(_measured(model_dir, dtype, timeout_s))


@functools.lru_cache(maxsize=8)
def _measured(model_dir: str, dtype: str, timeout_s: float) -> dict[str, Any]:
    try:
        p = subprocess.run([sys.executable, "-m", "experiments.measuring.ceilings", model_dir, dtype], capture_output=True,
                           text=True, timeout=timeout_s)
        if p.returncode == 0:
            return json.loads(p.stdout.strip().splitlines()[-1])
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    except (subprocess.TimeoutExpired, OSError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def fractions(s: dict[str, Any], params: int | None, compute: dict[str, Any], copy: dict[str, Any]) -> dict[str, Any]:
    """Achieved prefill FLOP/s and decode GB/s of one level, and their share of the ceilings."""
    out: dict[str, Any] = {}
    ttft = (s.get("ttft_ms") or {}).get("median")
    n = s.get("num_requests") or 0
    if params and ttft and n:
        out["prefill_gflops"] = 2 * params * (s["prompt_tokens"] / n) / (ttft / 1e3) / 1e9
        if compute.get("gflops"):
            out["prefill_of_ceiling"] = out["prefill_gflops"] / compute["gflops"]
    bw = s.get("bandwidth") or {}
    gbps = bw.get("achieved_gbps")
    peak = copy.get("gpu_gbps") if compute.get("device") == "cuda" else copy.get("cpu_gbps")
    if gbps and peak:
        out["decode_of_ceiling"] = gbps / peak
    if peak and bw.get("step_bytes"):  # the step's bytes at the copy bandwidth: no decode step is faster
        out["floor_ms"] = bw["step_bytes"] / (peak * 1e9) * 1e3
        if bw.get("tpot_ms"):
            out["tpot_over_floor"] = bw["tpot_ms"] / out["floor_ms"]
    return out


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], sys.argv[2])))
