"""Helpers shared by scripts/gpu/*.py: timing on CUDA, seeded prompts, HF models, tables, checks.

Every check appends markdown to a `Report` and records failures (correctness: exit 1) and missed
targets (performance: exit 3) there; nothing fails silently.
"""
from __future__ import annotations

import contextlib
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

DEVICE = "cuda"
SMOKE = False  # --smoke: the same code on CPU, tiny sizes (a developer without a GPU runs the script's paths)


class Report:
    """`out`: a markdown file appended to line by line, so a run cut short still leaves what it found."""

    def __init__(self, out: Path | None = None):
        self.out = out
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("")
        self.lines: list[str] = []
        self.failures: list[str] = []  # correctness: something is wrong
        self.missed: list[str] = []  # performance targets not met
        self.passed: list[str] = []
        self.t0 = time.perf_counter()

    def add(self, *lines: str) -> None:
        for line in lines:
            print(line, flush=True)
            self.lines.append(line)
            if self.out is not None:
                with self.out.open("a") as f:
                    f.write(line + "\n")

    def table(self, header: list[str], rows: list[list]) -> None:
        self.add("| " + " | ".join(header) + " |", "|" + "---|" * len(header))
        for r in rows:
            self.add("| " + " | ".join(str(c) for c in r) + " |")
        self.add("")

    def check(self, ok: bool, what: str) -> bool:
        """A correctness check: a failure makes the run exit 1."""
        (self.passed if ok else self.failures).append(what)
        print(("PASS  " if ok else "FAIL  ") + what, flush=True)
        return ok

    def target(self, ok: bool, what: str) -> bool:
        """A performance target: a miss makes the run exit 3 (unless something failed)."""
        (self.passed if ok else self.missed).append(what)
        print(("MET   " if ok else "MISSED ") + what, flush=True)
        return ok

    def section(self, title: str) -> None:
        self.add("", f"## {title}", f"(t = {time.perf_counter() - self.t0:.0f} s)", "")


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def free_memory() -> None:
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def timed(fn) -> float:
    """Seconds of fn(), device work included."""
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def prompts_for(vocab: int, n: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(8, vocab, (k,), generator=g).tolist() for k in lens]


def hf_from_pretrained(model_dir, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(DEVICE).eval()


def hf_from_config(model_dir, dtype: torch.dtype):
    """HF's model of a config.json with random weights made on the GPU (nothing downloaded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(model_dir))
    with torch.device(DEVICE):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        except TypeError:  # transformers before 4.56 spells it torch_dtype
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    return model.to(dtype).eval()


def no_cudnn_sdpa():
    """SDPA without cuDNN attention (the backends the engine's torch backend allows on CUDA)."""
    from torch.nn.attention import sdpa_kernel

    from reference_engine.attention import CUDA_SDPA

    return sdpa_kernel(CUDA_SDPA)


@torch.no_grad()
def hf_generate_tok_s(model, prompts: list[list[int]], out_len: int, cudnn: bool = True) -> float:
    """Output tokens/s of HF `generate()` on one static batch (equal-length prompts, greedy)."""
    ids = torch.tensor(prompts, device=DEVICE)
    mask = torch.ones_like(ids)
    ctx = contextlib.nullcontext() if cudnn else no_cudnn_sdpa()
    with ctx:
        model.generate(ids[:4], attention_mask=mask[:4], max_new_tokens=4, do_sample=False, pad_token_id=0)
        dt = timed(lambda: model.generate(ids, attention_mask=mask, max_new_tokens=out_len, min_new_tokens=out_len,
                                          do_sample=False, pad_token_id=0))
    return len(prompts) * out_len / dt


def count_replays(llm) -> list[int]:
    """Wrap the engine's graph replays; the returned list grows by one bucket size per replay."""
    graphs = llm.engine.runner.graphs
    seen: list[int] = []
    if graphs is None:
        return seen
    replay = graphs.replay

    def counting(b, n):
        seen.append(b)
        return replay(b, n)

    graphs.replay = counting
    return seen


def gib(n: float) -> str:
    return f"{n / (1 << 30):.2f}"
