"""Which code path runs a step, and why: the engine's dispatch in one table.

What decides a step's path: the device; the weights' dtype; the CPU's vector ISA (torch's CPU
capability, which honours ATEN_CPU_CAPABILITY; the C++ kernels are built for it); whether a C++ compiler
built the kernels; whether the CPU multiplies bf16 natively (oneDNN; the panels: AMX, else vdpbf16ps); tensor parallelism; the
model's q/k norm; the pins INFERLAB_LINEAR, INFERLAB_FUSED_DECODE and INFERLAB_AMX; and, per step, whether every row is a
decode and how many rows there are.

The parts keep their own rules (`PackedLinear` picks its kernel when packed, `FusedDecode.refusal`
says why the one-call layer does not apply, `FusedDecode.takes` and `CudaGraphs.bucket` look at each
step); this module asks the *built* runner what they decided, so the table cannot drift from what runs.
`routes(runner)` answers for a set of step shapes, `settings(runner)` is read back in
`LLMEngine.effective_config()["paths"]`, and `render(runner)` is what `inferlab serve --explain-paths
MODEL` prints. docs/engine.md has the same table.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

from reference_engine.attention import cpu_backend
from reference_engine.kernels import cpp_gemm, ops
from reference_engine.model import fused_decode, packed_linear
from reference_engine.model.packed_linear import PackedLinear, linear_kernel

# every environment variable that changes a path, read back as set ("" when unset)
PINS = ("INFERLAB_LINEAR", "INFERLAB_FUSED_DECODE", "INFERLAB_AMX", "ATEN_CPU_CAPABILITY", "CXX")


@dataclass(frozen=True)
class Route:
    """One step shape and the path each stage takes for it."""
    shape: str  # e.g. "decode x8"
    rows: int  # tokens in the step
    all_decode: bool
    layer: str  # who runs a decoder layer: "fused C++ layer", "CUDA graph replay", "modules"
    linear: str  # who multiplies the projections
    attention: str  # the attention backend and which of its kernels
    why: str


def linear_path(runner) -> tuple[str, str]:
    """(name, why) of the projections' kernel; every row count takes the same one (one weight layout)."""
    mods = [m for m in runner.model.modules() if isinstance(m, PackedLinear)]
    if not mods:
        return "torch", f"linear_backend={runner.cfg.linear_backend}: F.linear on the parameters"
    if all(m.panels is not None for m in mods):
        why = (f"{runner.dtype} weights held once as 32-column panels; one fixed sum order per output at every "
               "row count (kernels/cpp_gemm.py)")
        if runner.dtype != torch.bfloat16:
            return f"panel GEMM ({isa()})", why
        # bf16: AMX where it runs and K % 32 == 0, else vdpbf16ps or the widening FMAs (cpp_gemm.bf16_path)
        bf16 = "/".join(sorted({cpp_gemm.bf16_path(m.in_features) for m in mods}))
        return f"panel GEMM ({isa()}, {bf16})", why
    why = "INFERLAB_LINEAR=onednn" if os.environ.get("INFERLAB_LINEAR") == "onednn" else \
        "no C++ kernel here" if linear_kernel() != "inferlab" else f"{runner.dtype} weights: not packed as panels"
    return f"oneDNN packed ({runner.linear_compute_dtype})", why


def attention_path(runner, decodes: bool, prefills: bool) -> str:
    """The attention backend and, for the CPU one, which of its kernels a step with these rows runs."""
    name = runner.cfg.attention_backend
    if name != "cpu":
        return name
    amx = cpu_backend.amx_prefill(runner.dtype, runner.model_config.head_dim)
    kernels = [k for k, on in (("decode", decodes), ("prefill (amx)" if amx else "prefill", prefills)) if on]
    return f"cpu: C++ {' + '.join(kernels)} kernel" + ("s" if len(kernels) > 1 else "")


def layer_path(runner, rows: int, all_decode: bool) -> tuple[str, str]:
    """(who runs the decoder layers, why) for a step of `rows` tokens."""
    fast, graphs = runner.fast_decode, runner.graphs
    if graphs is not None and all_decode and graphs.bucket(rows) is not None:
        return "CUDA graph replay", f"all decodes, {rows} rows fit the captured size {graphs.bucket(rows)}"
    if fast is not None:
        if not all_decode:
            return "modules", "the one-call layer takes all-decode steps only"
        if rows > fast.max_rows:
            return "modules", f"{rows} rows > the one-call layer's {fast.max_rows}"
        return "fused C++ layer", f"all decodes, {rows} <= {fast.max_rows} rows: one C++ call per layer"
    return "modules", runner.fast_decode_refusal or "no fast path on this device"


def routes(runner) -> list[Route]:
    """The path of each stage for representative step shapes: decodes of 1, 8, the one-call layer's
    limit and one more, a prefill chunk, and a mixed step."""
    limit = runner.fast_decode.max_rows if runner.fast_decode is not None else PackedLinear.MID_M
    shapes = [(f"decode x{n}", n, True, False) for n in dict.fromkeys((1, 8, limit, limit + 1))]
    shapes += [("prefill chunk of 512", 512, False, True), ("mixed: 8 decodes + a 256-token chunk", 264, True, True)]
    lin, _ = linear_path(runner)
    out = []
    for shape, rows, decodes, prefills in shapes:
        layer, why = layer_path(runner, rows, not prefills)
        out.append(Route(shape, rows, not prefills, layer, lin, attention_path(runner, decodes, prefills), why))
    return out


def problems(cfg) -> list[str]:
    """The kernel settings that cannot hold on this machine, one line each: the `INFERLAB_*` pins read
    where the engine runs on CPU (packed_linear.pin_problems, fused_decode.pin_problems) and a config
    that names a C++ kernel (attention_backend="cpu", fused_ops=True) that does not build or load here.
    Each would otherwise fail every step it serves."""
    if torch.device(cfg.device).type != "cpu":
        return []
    problems = fused_decode.pin_problems()
    if cfg.linear_backend in (None, "onednn"):
        problems += packed_linear.pin_problems()
    if cfg.attention_backend == "cpu" and not ops.available():
        problems.append("attention_backend='cpu': its C++ kernel does not build or load here; use 'torch'")
    if cfg.fused_ops and not ops.available():
        problems.append("fused_ops=True: the C++ element-wise kernels do not build or load here; leave it unset")
    return problems


def isa() -> str:
    return torch.backends.cpu.get_cpu_capability()


def settings(runner) -> dict:
    """What `effective_config()["paths"]` reads back: the inputs that decide and the paths they chose."""
    fast = runner.fast_decode
    lin, _ = linear_path(runner)
    return {"device": str(runner.device), "dtype": str(runner.dtype).removeprefix("torch."),
            "isa": isa() if runner.device.type == "cpu" else None, "linear": lin,
            "fused_decode": fast is not None, "fused_decode_max_rows": fast.max_rows if fast is not None else None,
            "fused_decode_refusal": runner.fast_decode_refusal,
            "cuda_graph_sizes": list(runner.graphs.sizes) if runner.graphs is not None else [],
            "pins": {v: os.environ.get(v, "") for v in PINS}}


def render(runner) -> str:
    """The table `inferlab serve --explain-paths` prints (markdown)."""
    s = settings(runner)
    head = [f"device {s['device']}, dtype {s['dtype']}, ISA {s['isa'] or '-'}",
            f"linear, every row count: {s['linear']} ({linear_path(runner)[1]})",
            "one-call decode layer: " + (f"on, up to {s['fused_decode_max_rows']} rows" if s["fused_decode"]
                                         else f"off ({s['fused_decode_refusal']})"),
            "pins: " + (", ".join(f"{k}={v}" for k, v in s["pins"].items() if v) or "none set"), ""]
    rows = ["| step | layer | linear | attention | why |", "|---|---|---|---|---|"]
    rows += [f"| {r.shape} | {r.layer} | {r.linear} | {r.attention} | {r.why} |" for r in routes(runner)]
    return "\n".join(head + rows)


def as_dicts(runner) -> list[dict]:
    return [asdict(r) for r in routes(runner)]
