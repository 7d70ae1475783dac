"""GPU check for the reference engine: correctness and speed on CUDA, in one short run.

    python scripts/gpu_check.py [--out DIR]

1. fp32 greedy tokens vs HF transformers on the same GPU, for tiny Llama / Qwen2 / Qwen3:
   16 mixed-length prompts x 64 tokens, batched, then again with 16-token prefill chunks and
   a KV cache small enough to force preemption.
2. bf16: runs, and the agreement with HF bf16 is reported (near-ties may flip in bf16).
3. Offline decode throughput on the `small` preset (~100M params): the reference engine vs
   HF `generate()` with static batches, same prompts, greedy, fixed output length.
Prints a markdown summary (and writes it to DIR/gpu_check.md). Exit 1 if fp32 tokens differ.
Needs torch (CUDA), transformers, tokenizers, safetensors, jinja2: all in the GPU image.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from reference_engine import LLM, SamplingParams  # noqa: E402
from reference_engine.make_model import make_model  # noqa: E402


DEVICE = "cuda"
FAMILIES = ["llama", "qwen2", "qwen3"]


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def prompts_for(vocab: int, n: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(8, vocab, (k,), generator=g).tolist() for k in lens]


def hf_model(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(DEVICE).eval()


@torch.no_grad()
def hf_greedy_one_by_one(model, prompts, n: int) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = torch.tensor([p], device=DEVICE)
        r = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
        out.append(r[0, len(p):].tolist())
    return out


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


def check_correctness(root: Path, lines: list[str]) -> bool:
    ok = True
    greedy = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    lines += ["| family | dtype | setting | identical to HF | preemptions |", "|---|---|---|---|---|"]
    for family in FAMILIES:
        d = make_model(root / family, preset="tiny", family=family, seed=0)
        for dtype, tdtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            prompts = prompts_for(8192, 16, 1, 100)
            ref = hf_greedy_one_by_one(hf_model(d, tdtype), prompts, 64)
            for setting, kw in (("batched", {}), ("chunks of 16 + small KV",
                                                 {"max_num_batched_tokens": 16, "kv_cache_tokens": 640, "block_size": 8})):
                llm = LLM(str(d), device=DEVICE, dtype=dtype, **kw)
                outs = [o.token_ids for o in llm.generate(prompts, greedy)]
                agr = agreement(outs, ref)
                pre = llm.engine.scheduler.num_preemptions
                lines.append(f"| {family} | {dtype} | {setting} | {agr:.3f} | {pre} |")
                if dtype == "float32" and agr < 1.0:
                    ok = False
                del llm
            sync()
    return ok


def check_speed(root: Path, lines: list[str]) -> None:
    d = make_model(root / "small", preset="small", family="llama", seed=0)
    batch, out_len = 64, 128
    prompts = prompts_for(32768, batch, 128, 129, seed=1)
    lines += ["", f"Offline decode, `small` preset (~100M params), {batch} prompts x 128 tokens in, "
              f"{out_len} out, greedy:", "", "| engine | dtype | seconds | output tokens/s |", "|---|---|---|---|"]
    for dtype, tdtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        llm = LLM(str(d), device=DEVICE, dtype=dtype, max_num_seqs=batch, max_num_batched_tokens=8192)
        params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
        llm.generate(prompts[:4], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
        sync()
        t = time.perf_counter()
        llm.generate(prompts, params)
        sync()
        dt = time.perf_counter() - t
        lines.append(f"| reference | {dtype} | {dt:.2f} | {batch * out_len / dt:,.0f} |")
        del llm
        model = hf_model(d, tdtype)
        ids = torch.tensor(prompts, device=DEVICE)  # equal lengths: no padding needed
        with torch.no_grad():
            model.generate(ids[:4], attention_mask=torch.ones_like(ids[:4]), max_new_tokens=4, do_sample=False)
            sync()
            t = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out_len, min_new_tokens=out_len,
                           do_sample=False, pad_token_id=0)
            sync()
        dt = time.perf_counter() - t
        lines.append(f"| HF generate (static batch) | {dtype} | {dt:.2f} | {batch * out_len / dt:,.0f} |")
        del model
        sync()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu runs the same checks, slowly (to try the script)")
    ap.add_argument("--families", default="llama,qwen2,qwen3")
    ap.add_argument("--no-speed", action="store_true")
    args = ap.parse_args()
    global DEVICE, FAMILIES
    DEVICE, FAMILIES = args.device, args.families.split(",")
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible", file=sys.stderr)
        return 2
    lines = [f"# GPU check, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             f"{torch.cuda.get_device_name() if DEVICE == 'cuda' else DEVICE}, torch {torch.__version__}", "",
             "Greedy tokens of the reference engine vs HF transformers on the same GPU "
             "(16 prompts x 64 tokens):", ""]
    with tempfile.TemporaryDirectory() as tmp:
        ok = check_correctness(Path(tmp), lines)
        print("\n".join(lines), flush=True)
        if not args.no_speed:
            check_speed(Path(tmp), lines)
    text = "\n".join(lines) + "\n"
    print("\n".join(lines[-8:]))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_check.md").write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
