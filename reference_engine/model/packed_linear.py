"""CPU linear layers with weights prepacked for oneDNN, the GEMM library vLLM's CPU backend uses.

`torch.nn.functional.linear` on CPU calls MKL's sgemm on the weight as stored, every call. oneDNN
can reorder a weight once into the blocked layout its AVX2/AVX-512 kernels read
(`torch.ops.mkldnn._reorder_linear_weight`, what inductor's freezing pass does) and then multiply
against it (`torch.ops.mkldnn._linear_pointwise`); vLLM-CPU does the same through its own
`onednn_mm` handle. On the project's 2-core AVX2 machine this took a decode batch of 128 rows
from ~56 to ~110 GFLOP/s (docs/perf/cpu_vs_vllm.md).

bfloat16 on a CPU without bf16 dot-product instructions (no AVX512_BF16 / AMX): torch's bf16
GEMM runs at a fraction of fp32 speed and oneDNN refuses bf16 there. `PackedLinear` then keeps an
fp32 copy of the bf16 weights (the same values, exactly), multiplies in fp32 and rounds the
output to bf16, which is what a bf16 GEMM with fp32 accumulation returns (up to summation
order). Activations between layers stay bf16, the KV cache stays bf16; the engine reports
`linear_compute_dtype = "float32"` in its effective settings.

Large row counts (prefill chunks) may go to MKL's sgemm instead, in float32: on an Intel AVX2
machine it beat the packed oneDNN kernels from about 512 rows on (2048 rows of the small model's
projections: ~1.9 s against ~2.1 s), while oneDNN wins clearly below 128 rows (decode: 2x at 8
rows). On an AMD EPYC with AVX-512 the opposite held by far (2048 x 576 x 1536: MKL ~180, oneDNN
~420 GFLOP/s on 2 threads: MKL does not take its AVX-512 path on AMD). So which library takes
`LARGE_M` rows and more is measured once per process (`prefill_gemm`, ~0.1 s, when the first model
is packed) and read back in the engine's effective settings; `INFERLAB_PREFILL_GEMM=mkl|onednn`
pins it. `LARGE_M` is the crossover measured on the AVX2 machine, not a law.

Decode-sized fp32 products (at most `SMALL_M` rows) go to the project's own C++ kernel instead
(`decode_gemv()`: kernels/cpp_gemv.py, on W as stored, no extra copy): on SmolLM2 over its 121
products it read the weights 1.14-1.25x faster than oneDNN's packed kernel at 1-8 rows, and behind
`inferlab serve` took TPOT p50 from 24.8 / 35.5 / 39.0 to 21.1 / 26.6 / 27.0 ms at 1 / 4 / 8
streams (docs/perf/2026-12-03-decode-gemv.md); its rows are batch-invariant by construction.
`INFERLAB_DECODE_GEMV=onednn|inferlab` pins it. `SMALL_M` is where the two met on that machine.

Between the two, `SMALL_M` < rows <= `MID_M` (a decode batch: 64 sequences offline), fp32 products go to
the project's C++ GEMM (`mid_gemm()`: kernels/cpp_gemm.py, AVX-512, AVX2 + FMA or scalar) on a third copy of W, packed in
32-column panels: oneDNN there costs about its arithmetic plus the read of W; the GEMM overlaps the
two (SmolLM2, one pass over its 121 products: 1.1-1.35x oneDNN's speed from 13 to 128 rows, 0.9x at
256 and more, where oneDNN keeps prefill; docs/perf/2026-12-03-gemm.md). `INFERLAB_MID_GEMM=onednn`
pins oneDNN and drops the copy.

A pin that cannot hold here (either kernel without a compiler, a value that names nothing) is refused when the engine starts (`pin_problems`), in one line
naming the variable, its value and why, instead of failing every step it would serve.

Memory: the packed copies are held beside the parameters (`packed_bytes`, reported as
`weights_packed` in `LLMEngine.memory_report()`): 4 bytes per weight, beside the parameters' 4
(fp32) or 2 (bf16), and 4 more for the GEMM's panels where it is on (fp32).

Invariant: `pack(model)` replaces every `nn.Linear` of the model in place, keeps the original
parameters (tied embeddings, `param_bytes`, the loader's names) and changes no output beyond
floating-point summation order.
"""
from __future__ import annotations

import functools
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

from reference_engine.kernels import cpp_gemm, cpp_gemv, cpu_build


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def default_backend(device: str | torch.device) -> str:
    """`linear_backend` when the config leaves it None: "onednn" on CPU where torch has it, else "torch"."""
    return "onednn" if torch.device(device).type == "cpu" and available() else "torch"


def native_bf16() -> bool:
    """Does this CPU multiply bf16 natively (oneDNN takes bf16 weights)?"""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def prefill_gemm() -> str:
    """"mkl" or "onednn": the faster fp32 GEMM at prefill sizes on this CPU and thread count, measured
    once per process (best of 3 alternating runs of a 1024 x 1024 x 1024 product each) unless
    `INFERLAB_PREFILL_GEMM` names one."""
    pinned = _pinned("INFERLAB_PREFILL_GEMM")
    if pinned:
        return pinned
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    packed = torch.ops.mkldnn._reorder_linear_weight(w)
    runs = {"mkl": lambda: F.linear(x, w),
            "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(3):
        for name, run in runs.items():
            t = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t)
    return min(best, key=best.get)


PINS = {"INFERLAB_PREFILL_GEMM": ("mkl", "onednn"), "INFERLAB_DECODE_GEMV": ("inferlab", "onednn"),
        "INFERLAB_MID_GEMM": ("inferlab", "onednn")}
_MACHINE = object()  # pin_problem's default: this machine's compiler


def pin_problem(var: str, value: str, cxx: str | None | object = _MACHINE) -> str | None:
    """Why `var=value` (one of `PINS`) cannot hold here, in one line naming both and what to do; None
    where it can. A pin that could not hold would fail every step it serves, so the engine refuses it at
    start (`pin_problems`). `cxx` (the C++ compiler's path, None: no compiler) defaults to this machine's;
    the kernel must also build and load with this machine's. Both kernels have AVX-512, AVX2 + FMA and
    scalar code: no instruction set is refused."""
    choices = PINS[var]
    if value not in choices:
        return f"{var}={value!r}: expected " + " or ".join(repr(c) for c in choices)
    if value == "onednn" and not available():
        return f"{var}=onednn needs torch with oneDNN (torch.backends.mkldnn is off here); unset it"
    if value != "inferlab":
        return None
    cxx = cpu_build.compiler() if cxx is _MACHINE else cxx
    if cxx is None:
        return (f"{var}=inferlab needs a C++ compiler to build its kernel (CXX="
                f"{os.environ.get('CXX') or 'c++'} is not on PATH); unset it or pick onednn")
    kernel = cpp_gemm if var == "INFERLAB_MID_GEMM" else cpp_gemv
    if not kernel.available():
        return f"{var}=inferlab: its kernel ({kernel.__name__}) does not build or load here; unset it or pick onednn"
    return None


def pin_problems() -> list[str]:
    """`pin_problem` for every `INFERLAB_*` GEMM pin set in the environment (the engine checks them at start)."""
    return [p for var in PINS if (v := os.environ.get(var, "")) and (p := pin_problem(var, v))]


def _pinned(var: str) -> str:
    """The choice `var` names in the environment ("" when unset); one that cannot hold here is an error."""
    pinned = os.environ.get(var, "")
    problem = pinned and pin_problem(var, pinned)
    if problem:
        raise ValueError(problem)
    return pinned


@functools.cache
def decode_gemv() -> str:
    """"inferlab" (kernels/cpp_gemv.py) or "onednn": who multiplies fp32 products of at most `SMALL_M`
    rows. The C++ kernel wherever it builds, unless `INFERLAB_DECODE_GEMV` names one."""
    return _pinned("INFERLAB_DECODE_GEMV") or ("inferlab" if cpp_gemv.available() else "onednn")


@functools.cache
def mid_gemm() -> str:
    """"inferlab" (kernels/cpp_gemm.py) or "onednn": who multiplies fp32 products of `SMALL_M` + 1 to
    `MID_M` rows. The C++ GEMM wherever it builds (any ISA), unless `INFERLAB_MID_GEMM` names one."""
    return _pinned("INFERLAB_MID_GEMM") or ("inferlab" if cpp_gemm.available() else "onednn")


class PackedLinear(nn.Module):
    """`linear`'s forward over a oneDNN-packed copy of its weight (fp32, or bf16 where native);
    float32 inputs of `LARGE_M` rows or more through `F.linear` on the weight as stored when
    `large` is "mkl" (`prefill_gemm()` by default); float32 inputs of at most `SMALL_M` rows
    through the C++ GEMV when `small` is "inferlab" (`decode_gemv()` by default); float32 inputs of
    `SMALL_M` + 1 to `MID_M` rows through the C++ GEMM on `panels` when `mid` is "inferlab"
    (`mid_gemm()` by default)."""

    LARGE_M = 512
    SMALL_M = 12
    MID_M = 128

    def __init__(self, linear: nn.Linear, large: str | None = None, small: str | None = None,
                 mid: str | None = None):
        super().__init__()
        w = linear.weight.detach()
        self.out_dtype = w.dtype
        self.compute_dtype = w.dtype if w.dtype == torch.float32 or (w.dtype == torch.bfloat16 and native_bf16()) \
            else torch.float32
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w.to(self.compute_dtype))
        b = linear.bias
        self.bias = None if b is None else b.detach().to(self.compute_dtype)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the parameter stays reachable (state, tied embeddings)
        self.large_mkl = (large or prefill_gemm()) == "mkl" and w.dtype == torch.float32
        self.small_gemv = w.dtype == torch.float32 and w.is_contiguous() and (small or decode_gemv()) == "inferlab"
        self.panels = cpp_gemm.pack(w) if w.dtype == torch.float32 and (mid or mid_gemm()) == "inferlab" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.small_gemv and x.shape[0] <= self.SMALL_M and x.dim() == 2 and x.dtype == torch.float32:
            return cpp_gemv.gemv(x if x.stride(1) == 1 else x.contiguous(), self.weight, self.bias)
        if self.panels is not None and self.SMALL_M < x.shape[0] <= self.MID_M and x.dim() == 2 \
                and x.dtype == torch.float32:
            return cpp_gemm.gemm(x if x.stride(1) == 1 else x.contiguous(), self.panels, self.out_features, self.bias)
        if self.large_mkl and x.shape[0] >= self.LARGE_M and x.dtype == torch.float32:
            return F.linear(x, self.weight, self.bias)
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.compute_dtype), self.packed, self.bias, "none", [], "")
        return y.to(self.out_dtype)

    def packed_bytes(self) -> int:
        panels = 0 if self.panels is None else self.panels.numel() * self.panels.element_size()
        return self.packed.numel() * self.packed.element_size() + panels


def pack(model: nn.Module) -> nn.Module:
    """Swap every `nn.Linear` of `model` (CPU, float32 or bfloat16) for a `PackedLinear`."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and child.weight.dtype in (torch.float32, torch.bfloat16):
            setattr(model, name, PackedLinear(child))
        else:
            pack(child)
    return model


def packed_bytes(model: nn.Module) -> int:
    """Bytes of the packed copies, held beside the parameters."""
    return sum(m.packed_bytes() for m in model.modules() if isinstance(m, PackedLinear))


def layout_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of each weight layout held beside the parameters, by name ("onednn": oneDNN's packed
    copies, "panels": the C++ GEMM's 32-column panels); a layout the model does not hold is absent.
    The memory split shows each as its own column; their sum is `packed_bytes`."""
    out: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, PackedLinear):
            out["onednn"] = out.get("onednn", 0) + m.packed.numel() * m.packed.element_size()
            if m.panels is not None:
                out["panels"] = out.get("panels", 0) + m.panels.numel() * m.panels.element_size()
    return out


def compute_dtype(model: nn.Module) -> str:
    """The dtype the packed GEMMs multiply in ("float32" for bf16 weights on a CPU without bf16)."""
    kinds = {str(m.compute_dtype).removeprefix("torch.") for m in model.modules() if isinstance(m, PackedLinear)}
    return ", ".join(sorted(kinds)) or "none"
