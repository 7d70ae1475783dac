"""Every instruction set's build of the kernels (cpu_build: AVX-512, AVX2 + FMA, scalar), each in a
process of its own with torch's override ATEN_CPU_CAPABILITY=avx2 / default, for every ISA this CPU
can execute: the linear layer's tests (exactness, the same bits in every regime, batch and thread
invariance; fp32 and bf16) pass on each, and the GEMM's outputs are the same bits on every ISA (one
k-order FMA chain per output; bf16: vdpbf16ps' pair order, widened to FMAs below AVX512_BF16; AMX, where
the AVX-512 build has it, has sums of its own and is tested in test_cpp_gemm_bf16.py). The builds come from the cache `make setup` fills."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reference_engine.kernels import cpu_build

ORDER = ["DEFAULT", "AVX2", "AVX512"]
HERE = torch.backends.cpu.get_cpu_capability()
BELOW = ORDER[:ORDER.index(HERE)] if HERE in ORDER else []  # the builds this CPU can run besides its own
ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.skipif(not cpu_build.compiler_available(), reason="needs a C++ compiler"),
              pytest.mark.slow]  # a subprocess per ISA (and its build, where `make setup` did not cache it)



def outputs(inputs: str) -> dict[str, torch.Tensor]:
    """The GEMM's outputs on the saved inputs, at row counts across its tiles and regimes. (The inputs
    come from one process: torch.randn itself draws other numbers under another CPU capability.)"""
    from reference_engine.kernels import cpp_gemm, ops
    w, x = torch.load(inputs)
    p = cpp_gemm.pack(w)
    out = {f"gemm{m}": ops.linear(x[:m], p, 1000, None) for m in (1, 2, 5, 12, 13, 64, 300)}
    # bf16 pair panels in the pair order: vdpbf16ps where this build and CPU have it, else the widening FMAs
    wb, xb = w.to(torch.bfloat16), x.to(torch.bfloat16)
    pb = cpp_gemm.pack(wb)
    return out | {f"bf16_{m}": ops.linear_bf16(xb[:m], pb, 1000, None, "vdpbf16ps") for m in (1, 5, 7, 64, 300)}


def lane_outputs(inputs: str) -> dict[str, torch.Tensor]:
    """SiLU-and-multiply and the prefill and decode attention, fp32 and bf16: the AVX-512 build runs them on 16
    lanes where the AVX2 build runs 8, with the same operations per lane (exp included), so the same bits."""
    from reference_engine.kernels import ops
    gu, q, k, v = torch.load(inputs)
    tables, lens, starts = torch.tensor([[0, 1, 2], [3, 4, 5]]), torch.tensor([40, 23]), torch.tensor([0, 40, 63])
    out = {}
    for dt in (torch.float32, torch.bfloat16):
        g, o = gu.to(dt), torch.empty(gu.shape[0], gu.shape[1] // 2, dtype=dt)
        ops.silu_mul(g, o)
        a = torch.empty(q.shape, dtype=dt)  # 2 prompts of 40 and 23 tokens, 9 heads over 3, 16-token blocks
        ops.prefill(q.to(dt), k.to(dt), v.to(dt), tables, lens, starts, 0.125, a)
        d = torch.empty(2, 9, 64, dtype=dt)  # one query token of each sequence
        ops.decode(q[:2].to(dt), k.to(dt), v.to(dt), tables, lens, 0.125, d)
        out |= {f"silu_{dt}": o, f"prefill_{dt}": a, f"decode_{dt}": d}
    return out


OUTPUTS = f"""
import sys, torch
from reference_engine.kernels import cpu_build
from {__name__} import outputs, lane_outputs
assert cpu_build.isa() == sys.argv[3], (cpu_build.isa(), sys.argv[3])
torch.save((lane_outputs if sys.argv[4] == "lanes" else outputs)(sys.argv[1]), sys.argv[2])
"""


def _run(isa: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": isa.lower(), "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, cwd=ROOT)


def _outputs(isa: str, inputs, tmp_path, which: str = "gemm") -> dict[str, torch.Tensor]:
    f = tmp_path / f"{isa}.pt"
    run = _run(isa, "-c", OUTPUTS, str(inputs), str(f), isa, which)
    assert run.returncode == 0, run.stderr[-2000:]
    return torch.load(f)


@pytest.mark.parametrize("isa", BELOW)
def test_the_linear_kernels_tests_pass_on_each_isa_build(isa):
    # AMX runs in the AVX-512 build only (the tests of its sums and of its SiLU epilogue would skip here, and
    # every test must run)
    run = _run(isa, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "not amx_is_the_exact and not silu_epilogue",
               "tests/reference_engine/kernels/test_cpp_gemm.py",
               "tests/reference_engine/kernels/test_cpp_gemm_bf16.py", "tests/reference_engine/model/test_packed_linear.py",
               "tests/reference_engine/model/test_fused_ops.py::test_rotary_in_place_on_qkv_views_is_bit_identical")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " skipped" not in run.stdout, run.stdout[-1000:]


@pytest.mark.skipif(not BELOW, reason="this CPU executes one ISA build only")
def test_the_gemm_gives_the_same_bits_on_every_isa(tmp_path):
    g = torch.Generator().manual_seed(7)
    inputs = tmp_path / "inputs.pt"
    torch.save((torch.randn(1000, 576, generator=g), torch.randn(300, 576, generator=g)), inputs)
    outs = {isa: _outputs(isa, inputs, tmp_path) for isa in BELOW} | {HERE: outputs(inputs)}
    for isa, out in outs.items():
        for k, v in out.items():
            assert torch.equal(v, outs[HERE][k]), (isa, k)


@pytest.mark.skipif(HERE != "AVX512", reason="the 16-lane code is in the AVX-512 build")
def test_the_16_lane_elementwise_and_attention_code_gives_the_8_lane_bits(tmp_path):
    g = torch.Generator().manual_seed(8)
    inputs = tmp_path / "lanes.pt"
    torch.save((torch.randn(37, 2 * 1000, generator=g) * 6, torch.randn(63, 9, 64, generator=g),
                torch.randn(6, 16, 3, 64, generator=g), torch.randn(6, 16, 3, 64, generator=g)), inputs)
    avx2, here = _outputs("AVX2", inputs, tmp_path, "lanes"), lane_outputs(inputs)
    for k, v in here.items():
        assert torch.equal(v, avx2[k]), k
