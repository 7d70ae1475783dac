"""GPU check for the reference engine: correctness, kernels and speed on CUDA, in one run (< 8 min, H200).

    python scripts/gpu/check.py [--out DIR] [--skip kernels,correctness,bf16,shapes] [--shapes Qwen3-0.6B]

1. Triton kernels vs the PyTorch backend, compiled, incl. padding and a captured graph (attention_kernels.py).
2. fp32 greedy tokens vs HF transformers on the same GPU, tiny Llama / Qwen2 / Qwen3, 16 mixed-length
   prompts x 64 tokens: the CUDA default (Triton + CUDA graphs) batched and with 16-token chunks and
   a KV cache small enough to preempt, and the torch backend eagerly; bf16 agreement reported.
3. The bf16 slowdown of 2026-11-30: the cuDNN-attention hypothesis checked (bf16.py); before
   the shapes, so a timeout cuts the long shapes section rather than the bf16 verdict.
4. Qwen3-0.6B and Llama-3.1-8B shapes: decode step vs roofline at batch 1/8/64/256, graphs vs eager,
   prefill tok/s (no prefix caching), memory report, output tok/s vs HF (shapes.py).
Targets (issue 12): 8B decode step at batch 64 >= 70 % of the roofline with graphs; graphs >= 2x eager
at batch 1 on Qwen3-0.6B; >= 3x HF (the faster of its two SDPA settings) at batch 64 on both shapes;
fp32 greedy identical to HF.

Prints markdown (and writes DIR/gpu_check.md). Exit 0: all correct, all targets met; 1: something
is wrong (a token, a kernel, a memory figure, an exception); 3: correct, but a target missed; 2: no GPU.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch

import common
from common import Report, count_replays, free_memory, hf_from_pretrained, prompts_for
from reference_engine import LLM, SamplingParams
from reference_engine.model.make import make_model

FAMILIES = ["llama", "qwen2", "qwen3"]
SECTIONS = ["kernels", "correctness", "bf16", "shapes"]  # bf16 before the long shapes: a timeout cuts shapes
N_PROMPTS, N_OUT = 16, 64


@torch.no_grad()
def hf_greedy_one_by_one(model, prompts, n: int) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = torch.tensor([p], device=common.DEVICE)
        r = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
        out.append(r[0, len(p):].tolist())
    return out


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


SETTINGS = {  # name: (engine options, graphs expected)
    "Triton + CUDA graphs (default), batched": ({}, True),
    "Triton + CUDA graphs, chunks of 16 + small KV": (dict(max_num_batched_tokens=16, kv_cache_tokens=640,
                                                          block_size=8), True),
    "torch backend, eager, batched": (dict(attention_backend="torch", enforce_eager=True), False),
}


def check_correctness(rep: Report, root: Path) -> None:
    rep.section(f"Greedy tokens vs HF transformers on the same GPU ({N_PROMPTS} prompts x {N_OUT} tokens)")
    greedy = SamplingParams(max_tokens=N_OUT, temperature=0.0, ignore_eos=True)
    rows = []
    for family in FAMILIES:
        d = make_model(root / family, preset="tiny", family=family, seed=0)
        prompts = prompts_for(8192, N_PROMPTS, 1, 100)
        for dtype, tdtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            if dtype == "bfloat16" and family != "llama":
                continue  # bf16 agreement is informative only: near-ties flip; one family is enough
            ref = hf_greedy_one_by_one(hf_from_pretrained(d, tdtype), prompts, N_OUT)
            free_memory()
            for setting, (kw, graphs) in SETTINGS.items():
                llm = LLM(str(d), device=common.DEVICE, dtype=dtype, **kw)
                seen = count_replays(llm)
                outs = [o.token_ids for o in llm.generate(prompts, greedy)]
                agr, pre = agreement(outs, ref), llm.engine.scheduler.num_preemptions
                rows.append([family, dtype, setting, f"{agr:.3f}", pre, len(seen)])
                if dtype == "float32":
                    rep.check(agr == 1.0, f"{family} fp32 {setting}: identical to HF ({agr:.3f})")
                if graphs and common.DEVICE == "cuda":
                    rep.check(len(seen) > 0, f"{family} {dtype} {setting}: decode steps replayed graphs")
                del llm
                free_memory()
    rep.table(["family", "dtype", "setting", "identical to HF", "preemptions", "graph replays"], rows)


def failed(rep: Report, what: str) -> None:
    traceback.print_exc()
    rep.check(False, f"{what} raised {traceback.format_exc().strip().splitlines()[-1]}")


def targets(rep: Report, shapes: dict) -> None:
    rep.section("Targets (issue 12)")
    rows = []
    b64 = 64 if not common.SMOKE else 4
    if "Llama-3.1-8B" in shapes:
        m = shapes["Llama-3.1-8B"][b64]
        share = m["graphs_roof"] / m["graphs_ms"]
        rows.append(["8B decode step, batch 64, graphs, share of roofline", f"{100 * share:.0f} %", ">= 70 %",
                     "yes" if rep.target(share >= 0.7, f"8B batch-64 decode at {100 * share:.0f} % of the roofline") else "NO"])
    if "Qwen3-0.6B" in shapes:
        m = shapes["Qwen3-0.6B"][1]
        x = m["eager_ms"] / m["graphs_ms"]
        rows.append(["Qwen3-0.6B batch 1, graphs vs eager", f"{x:.1f}x", ">= 2x",
                     "yes" if rep.target(x >= 2, f"Qwen3-0.6B batch-1 graphs {x:.1f}x eager") else "NO"])
    for name, res in shapes.items():
        if "hf_tok_s" not in res:
            rows.append([f"{name} output tok/s vs HF", "HF did not run", ">= 3x",
                         "yes" if rep.target(False, f"{name} vs HF: HF baseline did not run") else "NO"])
            continue
        x = res["engine_tok_s"] / max(res["hf_tok_s"], res["hf_nocudnn_tok_s"])
        rows.append([f"{name} output tok/s vs HF, batch 64", f"{x:.1f}x", ">= 3x",
                     "yes" if rep.target(x >= 3, f"{name} batch-64 output {x:.1f}x HF") else "NO"])
    rep.table(["target", "measured", "wanted", "met"], rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip", default="", help=f"comma-separated sections to skip: {','.join(SECTIONS)}")
    ap.add_argument("--shapes", default="Qwen3-0.6B,Llama-3.1-8B")
    ap.add_argument("--smoke", action="store_true",
                    help="no GPU: run every section's code on CPU at toy sizes (Triton interpreted); numbers mean nothing")
    args = ap.parse_args()
    if args.smoke:
        global FAMILIES, N_PROMPTS, N_OUT
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels module is imported
        common.DEVICE, common.SMOKE = "cpu", True
        FAMILIES, N_PROMPTS, N_OUT = ["llama"], 4, 8
        import shapes as shape_checks  # the module; `shapes` below is this run's results

        shape_checks.shrink()
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible", file=sys.stderr)
        return 2
    skip = {s for s in args.skip.split(",") if s}
    rep = Report(Path(args.out) / "gpu_check.md" if args.out else None)
    import triton

    rep.add(f"# GPU check, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "",
            f"{torch.cuda.get_device_name() if common.DEVICE == 'cuda' else 'CPU (--smoke: numbers mean nothing)'}, "
            f"torch {torch.__version__}, triton {triton.__version__}", "")
    shapes: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in SECTIONS:
            if name in skip:
                continue
            try:
                if name == "kernels":
                    # not `kernels.py`: that name would shadow HF's `kernels` package, which transformers imports
                    from attention_kernels import check_kernels
                    check_kernels(rep)
                elif name == "correctness":
                    check_correctness(rep, root)
                elif name == "bf16":
                    from bf16 import check_bf16
                    check_bf16(rep, root)
                else:
                    from shapes import check_shape, copy_bandwidth
                    bw = copy_bandwidth()
                    for shape in args.shapes.split(","):
                        try:
                            shapes[shape] = check_shape(rep, root, shape, bw)
                        except Exception:
                            failed(rep, f"shape {shape}")
                        free_memory()
            except Exception:  # one broken section must not hide the others' results
                failed(rep, f"section {name}")
            free_memory()
    if shapes:
        targets(rep, shapes)
    rep.section("Summary")
    rep.add(f"{len(rep.passed)} passed, {len(rep.failures)} FAILED, {len(rep.missed)} targets MISSED", "")
    for f in rep.failures:
        rep.add(f"- FAILED: {f}")
    for m in rep.missed:
        rep.add(f"- MISSED: {m}")
    return 1 if rep.failures else 3 if rep.missed else 0


if __name__ == "__main__":
    sys.exit(main())
