"""CPU linear layers over one resident copy of each weight: the C++ GEMM's 32-column panels.

Every fp32 or bf16 projection is packed once (`kernels/cpp_gemm.py`) into k-major panels of 32 output columns,
(P, K, 32), and that is the only copy the engine holds: the panel GEMM (csrc/linear.cpp) reads it for
every row count, a decode step's 1-12 rows, a decode batch's 13-128, a prefill chunk's thousands. The
GEMV on W as stored, oneDNN's packed copy and MKL on the parameter (three layouts, 12 bytes per weight,
until 2026-12-04) are gone; docs/perf/2026-12-04-one-layout.md has the A/B per row count.
bf16 weights are held the same way, once, as bf16 pair panels (P, K/2, 32, 2) (2 bytes per weight;
oneDNN's path holds the parameter and its copy, 4): vdpbf16ps on AVX512_BF16, the pairs widened to fp32
elsewhere, the same bits (kernels/cpp_gemm.py). The default since 2026-12-05: on SmolLM2 served (3 repeats)
their TPOT is 0.69-0.78x oneDNN's and the weights take half the memory; their prefill GEMM is still 5-6 %
behind oneDNN's, so TTFT is level with vLLM's in one run and 4 % behind at 4 streams in another
(docs/perf/2026-12-05-bf16-panels.md).

Rounding: y[m, n] = fma(x[m, K-1], W[n, K-1], ... fma(x[m, 0], W[n, 0], 0)) in k order, then + bias,
whatever the row count, the tile, the thread and the instruction set (AVX-512, AVX2 + FMA and scalar
give the same bits): a sequence's logits do not depend on what it is batched with, nor on whether its
step was a decode, a decode batch or a prefill (tests/reference_engine/model/test_packed_linear.py).
bf16: the pair order of vdpbf16ps, fp32 sums, + bias, one rounding to bf16; batch-invariant the same way.

Huge pages: `pack` writes all of a model's panels into one region mapped for 2 MiB pages (model/hugepages.py):
a decode step streams every panel once, and on 4 KiB pages the one-row SmolLM2 fp32 step took 22-25 ms
where on 2 MiB pages it takes 13-20 (docs/perf/2026-12-05-hugepages.md).

Tied embeddings (SmolLM2): the LM head's panels are also the embedding table; `PanelEmbedding` gathers
rows from them (exact copies), so the tied matrix is stored once.

`weight` is not resident on the panel path: reading it unpacks a fresh (out, in) copy (4 bytes per
weight while it lives), for code that wants W as nn.Linear stores it (TP sharding runs before packing,
the handbook's labs, HF comparisons in tests).

Fallback (`INFERLAB_LINEAR=onednn`, or no C++ compiler): oneDNN's
packed copy beside the parameter, as before. bf16 there on a CPU without bf16 dot products (no AVX512_BF16 / AMX): oneDNN refuses bf16, so
`PackedLinear` keeps an fp32 copy of the bf16 weights (the same values, exactly), multiplies in fp32 and
rounds the output to bf16; the engine reports `linear_compute_dtype = "float32"`. The panels need no
such copy: their kernel widens bf16 pairs in registers on any CPU.

A pin that cannot hold here (`INFERLAB_LINEAR=inferlab` without a compiler, a value that names
nothing, or one of the three pins of the three-layout design) is refused when the engine starts
(`pin_problems`), in one line naming the variable, its value and why.

Memory: `layout_bytes(model)` has the packed projections by layout ("panels", fp32 or bf16; "onednn"); the model's
parameters and buffers (norms, an untied embedding, biases, the fallback's parameters) are the
"weights" of the memory split (`memory_plan.param_bytes`): the panels are neither, so nothing is
counted twice.

Invariant: `pack(model)` replaces every `nn.Linear` of the model in place and changes no output beyond
floating-point summation order.
"""
from __future__ import annotations

import functools
import os

import torch
from torch import nn

from reference_engine.kernels import cpp_gemm, cpu_build, ops
from reference_engine.model import hugepages


def onednn_available() -> bool:
    """Does this torch have oneDNN's packed linear (the fallback's kernel)?"""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def default_backend(device: str | torch.device) -> str:
    """`linear_backend` when the config leaves it None: "onednn" on CPU where torch has it, else "torch"."""
    return "onednn" if torch.device(device).type == "cpu" and onednn_available() else "torch"


def native_bf16() -> bool:
    """Does this CPU multiply bf16 natively (oneDNN takes bf16 weights)?"""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


PINS = {"INFERLAB_LINEAR": ("inferlab", "onednn")}
GONE = ("INFERLAB_PREFILL_GEMM", "INFERLAB_DECODE_GEMV", "INFERLAB_MID_GEMM")  # the three-layout design's
_MACHINE = object()  # pin_problem's default: this machine's compiler


def pin_problem(var: str, value: str, cxx: str | None | object = _MACHINE) -> str | None:
    """Why `var=value` (one of `PINS`, or a `GONE` pin) cannot hold here, in one line naming both and
    what to do; None where it can. The engine refuses it at start (`pin_problems`). `cxx` (the C++
    compiler's path, None: no compiler) defaults to this machine's; the kernel must also build and load
    here. The kernel has AVX-512, AVX2 + FMA and scalar code: no instruction set is refused."""
    if var in GONE:
        return (f"{var}={value!r}: no longer exists (one weight layout serves every row count); unset it "
                "(INFERLAB_LINEAR=inferlab|onednn picks the layout)")
    choices = PINS[var]
    if value not in choices:
        return f"{var}={value!r}: expected " + " or ".join(repr(c) for c in choices)
    if value == "onednn" and not onednn_available():
        return f"{var}=onednn needs torch with oneDNN (torch.backends.mkldnn is off here); unset it"
    if value != "inferlab":
        return None
    cxx = cpu_build.compiler() if cxx is _MACHINE else cxx
    if cxx is None:
        return (f"{var}=inferlab needs a C++ compiler to build its kernel (CXX="
                f"{os.environ.get('CXX') or 'c++'} is not on PATH); unset it or pick onednn")
    if not ops.available():
        return f"{var}=inferlab: the C++ kernels (kernels/ops.py) do not build or load here; unset it or pick onednn"
    return None


def pin_problems() -> list[str]:
    """`pin_problem` for every linear pin set in the environment (the engine checks them at start), and
    INFERLAB_AMX: "0" keeps bf16 panels off AMX (the pair order everywhere), "1" (or unset) uses it where it runs."""
    amx = os.environ.get("INFERLAB_AMX", "1")
    bad = [] if amx in ("0", "1") else [f"INFERLAB_AMX={amx!r}: expected '0' (off) or '1' (where the CPU has AMX)"]
    return bad + [p for var in (*PINS, *GONE) if (v := os.environ.get(var, "")) and (p := pin_problem(var, v))]


def _pinned(var: str) -> str:
    """The choice `var` names in the environment ("" when unset); one that cannot hold here is an error."""
    pinned = os.environ.get(var, "")
    problem = pinned and pin_problem(var, pinned)
    if problem:
        raise ValueError(problem)
    return pinned


@functools.cache
def linear_kernel() -> str:
    """"inferlab" (one layout: the panels, kernels/cpp_gemm.py) or "onednn" (oneDNN's packed copy beside
    the parameter): who multiplies fp32 and bf16 projections alike (bf16 stayed on oneDNN by default until
    2026-12-05). The panels wherever the kernel builds, unless
    `INFERLAB_LINEAR` names one."""
    return _pinned("INFERLAB_LINEAR") or ("inferlab" if ops.available() else "onednn")


class PackedLinear(nn.Module):
    """`linear`'s forward over one resident copy of its weight: fp32 or bf16 weights in the panels
    (`kernel` "inferlab"; by default `linear_kernel()`), any row count;
    else oneDNN's packed copy (fp32, or bf16 where native) beside the parameter (`param`)."""

    MID_M = 128  # the most rows the fused decode layer takes (a decode batch; fused_decode.py)

    def __init__(self, linear: nn.Linear, kernel: str | None = None, arena: hugepages.Arena | None = None):
        super().__init__()
        w = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype = w.dtype
        b = linear.bias
        kernel = kernel or linear_kernel()
        if w.dtype in (torch.float32, torch.bfloat16) and kernel == "inferlab":
            self.compute_dtype = w.dtype
            # the one copy: fp32 (P, K, 32), bf16 (P, K/2, 32, 2); in `arena` (2 MiB pages) when given
            out = None if arena is None else arena.take(cpp_gemm.shape(*w.shape, w.dtype), panel_dtype(w))
            self.panels, self.packed, self.param = cpp_gemm.pack(w, out), None, None
        else:
            self.compute_dtype = w.dtype if w.dtype == torch.float32 or (w.dtype == torch.bfloat16 and native_bf16()) \
                else torch.float32
            self.panels = None
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w.to(self.compute_dtype))
            self.param = linear.weight  # reachable: tied embeddings, `weight`
        # a buffer: counted with the parameters in the memory split's "weights"
        self.register_buffer("bias", None if b is None else b.detach().to(self.compute_dtype))

    @property
    def weight(self) -> torch.Tensor:
        """W (out, in): on the panel path unpacked on demand (a fresh copy, not resident); else the parameter."""
        return self.param if self.panels is None else cpp_gemm.unpack(self.panels, self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.panels is not None:
            rows = x.reshape(-1, x.shape[-1]).to(self.compute_dtype)  # (..., in) -> (M, in); a bf16 model's x is bf16
            rows = rows if rows.stride(1) == 1 else rows.contiguous()
            y = ops.linear(rows, self.panels, self.out_features, self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.compute_dtype), self.packed, self.bias, "none", [], "")
        return y.to(self.out_dtype)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """For a stacked gate_up projection: silu(gate) * up of x (M, in) in one pass where the bf16 panels run
        on AMX (`ops.linear_silu`, the same bits as forward then SiLU-and-multiply); None elsewhere."""
        if self.panels is None or x.dtype != torch.bfloat16 or self.compute_dtype != torch.bfloat16 or x.dim() != 2 \
                or x.stride(1) != 1 or self.bias is not None or not cpp_gemm.silu_fuses(self.in_features, self.out_features):
            return None
        return ops.linear_silu(x, self.panels, self.out_features)

    def packed_bytes(self) -> int:
        held = self.panels if self.panels is not None else self.packed
        return held.numel() * held.element_size()


class PanelEmbedding(nn.Module):
    """The embedding of a model whose LM head is tied to it, read from the head's panels: row t of the
    table is W[t] = panels[t // 32, :, t % 32], an exact copy; no second table is held."""

    def __init__(self, head: PackedLinear):
        super().__init__()
        self.head = [head]  # a list: not a submodule (the head is the model's, counted there)
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = cpp_gemm.rows(self.head[0].panels, ids.reshape(-1), self.embedding_dim)  # fp32 or bf16 panels
        return rows.view(*ids.shape, self.embedding_dim)  # (..., K)


def panel_dtype(w: torch.Tensor) -> torch.dtype:
    return torch.bfloat16 if w.dtype == torch.bfloat16 else torch.float32


def arena(weights: list[torch.Tensor]) -> hugepages.Arena | None:
    """One huge-page region for the panels of these weights (hugepages.py: a decode step streams them
    all), or None where the panels are not the kernel (oneDNN's copies are allocated by oneDNN)."""
    if not weights or linear_kernel() != "inferlab":
        return None
    return hugepages.Arena(sum(hugepages.size(cpp_gemm.shape(*w.shape, w.dtype), panel_dtype(w)) for w in weights))


def packable(w: torch.Tensor | None) -> bool:
    """Is this a weight `pack` swaps (fp32 or bf16)?"""
    return w is not None and w.dtype in (torch.float32, torch.bfloat16)


def pack(model: nn.Module) -> nn.Module:
    """Swap every `nn.Linear` of `model` (CPU, float32 or bfloat16) for a `PackedLinear`, one at a time
    (each parameter is freed as its panels are made: the peak is one projection above the loaded
    model), their panels in one huge-page `arena`; a tied embedding then reads the LM head's panels
    (`PanelEmbedding`)."""
    _swap(model, arena([m.weight for m in model.modules() if isinstance(m, nn.Linear) and packable(m.weight)]))
    cfg, head = getattr(model, "cfg", None), getattr(model, "lm_head", None)
    if getattr(cfg, "tie_word_embeddings", False) and isinstance(head, PackedLinear) and head.panels is not None:
        model.model.embed_tokens = PanelEmbedding(head)
    return model


def _swap(model: nn.Module, region: hugepages.Arena | None) -> None:
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and packable(child.weight):
            setattr(model, name, PackedLinear(child, arena=region))
        else:
            _swap(child, region)


def packed_bytes(model: nn.Module) -> int:
    """Bytes of the packed projections (the panels, or oneDNN's copies), none of them a parameter."""
    return sum(m.packed_bytes() for m in model.modules() if isinstance(m, PackedLinear))


def layout_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of each weight layout, by name ("panels": the one resident copy of the fp32 or bf16 projections;
    "onednn": oneDNN's packed copies on the fallback path, whose parameters count as "weights"); a
    layout the model does not hold is absent. The memory split shows each as its own column; their sum
    is `packed_bytes`."""
    out: dict[str, int] = {}
    for m in model.modules():
        if isinstance(m, PackedLinear):
            name = "panels" if m.panels is not None else "onednn"
            out[name] = out.get(name, 0) + m.packed_bytes()
    return out


def compute_dtype(model: nn.Module) -> str:
    """The dtype the packed GEMMs multiply in ("float32" for bf16 weights on a CPU without bf16)."""
    kinds = {str(m.compute_dtype).removeprefix("torch.") for m in model.modules() if isinstance(m, PackedLinear)}
    return ", ".join(sorted(kinds)) or "none"
