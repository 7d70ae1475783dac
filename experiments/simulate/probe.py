"""The machine's speed, probed while a held-out round runs (held-out round 2's lesson:
docs/perf/2026-12-07-heldout-round2.md).

On this VM the memory-bound speed moves under a session: a fit model's one-row decode step took 57.9 ms at 00:50
and 51.2 ms at 01:54, and one pass over a model's weights in the engine's GEMM took 54.0 ms and then 46.5 ms a
minute apart. A step model fitted in one phase and judged in another measures that drift as much as its own error,
so each phase of a round records two probes:

- `gemm_pass`: one pass over a model's linear layers as a one-row decode step calls them (per layer the fused
  qkv, o, gate_up and down projections, then the LM head), in the engine's kernel (ops.linear on cpp_gemm
  panels), on random panels laid out one after another in one buffer of the model's weight bytes: the same bytes
  from the same level of the memory hierarchy as the engine streams. Its shape is enough: no weights, no engine.
  (Tried as the step model's weight term after round 2, it predicted round 2's held-out model worse than bytes
  over bandwidth did: results/heldout-round2/diagnostics/; so it is a probe, not a term.)
- `one_row`: the engine's own one-row decode steps of a fit model (a short greedy answer, in-process) against the
  profile: the control. Its error is the machine's drift since calibration plus the profile's error on a model it
  was fitted on; a held-out model's error beside it, measured minutes apart, separates transfer from drift.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from experiments.simulate.step_model import ModelShape, Profile, predict

DTYPES = ("float32", "bfloat16")  # the panel GEMM's dtypes (cpp_gemm)


def matrices(m: ModelShape) -> list[tuple[int, int]]:
    """(N, K) of each linear layer a decode step calls, in order: per layer qkv, o, gate_up, down; the LM head."""
    h, d = m.hidden, m.head_dim
    layer = [((m.heads + 2 * m.kv_heads) * d, h), (h, m.heads * d), (2 * m.intermediate, h), (h, m.intermediate)]
    return layer * m.layers + [(m.vocab, h)]


def gemm_pass(m: ModelShape, threads: int, repeats: int = 7) -> float:
    """Median seconds of one pass over the model's decode GEMMs at one row (module docstring)."""
    import torch

    from reference_engine.kernels import cpp_gemm, ops

    if m.dtype not in DTYPES:
        raise ValueError(f"gemm_pass: no panel GEMM for {m.dtype} (has {', '.join(DTYPES)})")
    dt = getattr(torch, m.dtype)
    mats = matrices(m)
    sizes = [torch.Size(cpp_gemm.shape(n, k, dt)) for n, k in mats]
    buf = torch.empty(sum(s.numel() for s in sizes), dtype=dt).uniform_(-0.05, 0.05)  # every page touched
    panels, at = [], 0
    for s in sizes:
        panels.append(buf[at:at + s.numel()].view(s))
        at += s.numel()
    xs = {k: torch.randn(1, k).to(dt) for _, k in mats}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        def one() -> float:
            t0 = time.perf_counter()
            for (n, k), p in zip(mats, panels):
                ops.linear(xs[k], p, n)
            return time.perf_counter() - t0

        one()  # warm: the kernel's first call, the pages' TLB entries
        return statistics.median(one() for _ in range(repeats))
    finally:
        torch.set_num_threads(before)


def one_row_steps(model_dir: str | Path, threads: int, tokens: int = 48, skip: int = 10,
                  prompt: int = 64) -> list:
    """The engine's one-row decode steps of the model in-process: two greedy `prompt`-token prompts, `tokens` each,
    the first `skip` steps of each left out; -> [(StepShape, seconds)]."""
    from experiments.simulate import sweep
    from reference_engine import EngineConfig, LLMEngine, SamplingParams

    eng = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", num_threads=threads, kv_cache_tokens=4096,
                                 record_steps=True, enable_prefix_caching=False))
    for _ in range(2):
        eng.add_request([5 + i % 4000 for i in range(prompt)], SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0))
        while eng.has_unfinished():
            eng.step()
    steps = [(s, t) for s, t in sweep.shapes(eng.step_records) if len(s.seqs) == 1 and s.seqs[0][0] == 1]
    return steps[skip:tokens - 1] + steps[tokens - 1 + skip:]  # each answer's steady steps


def one_row(model_dir: str | Path, prof: Profile, threads: int, tokens: int = 48, skip: int = 10,
            prompt: int = 64) -> dict:
    """`one_row_steps` measured against the profile: median seconds and the signed error. Round 4's control at 64
    tokens read +4-8 % where the sweep's one-row steps (contexts to 1,000+) read +0.5 %: take `prompt` at the
    contexts the sweep ran, so that the control reads the machine, not the profile's short-context error."""
    steps = one_row_steps(model_dir, threads, tokens, skip, prompt)
    m = ModelShape.from_dir(model_dir)
    measured = statistics.median(t for _, t in steps)
    predicted = statistics.median(predict(s, m, prof) for s, _ in steps)
    return {"model": str(model_dir), "utc": time.strftime("%H:%M:%S", time.gmtime()), "steps": len(steps),
            "measured_ms": measured * 1e3, "predicted_ms": predicted * 1e3, "error": predicted / measured - 1}


__all__ = ["matrices", "gemm_pass", "one_row_steps", "one_row"]
