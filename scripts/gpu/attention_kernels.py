"""Triton attention kernels vs the PyTorch backend, compiled, on the GPU (part of check.py).

Each case is a step of sequences (cached context, new query tokens), decodes first, over a paged
cache whose block ids are shuffled and whose unused slots hold noise. The reference is
`TorchBackend` in float32 on the unpadded step; the Triton backend gets the step from the engine's
persistent buffers (`StepInputs`, int32 tables, pinned host copies), padded where it is all decodes.
Checked: outputs within tolerance, the KV cache written identically (padding writes nothing), and a
decode step captured in a CUDA graph and replayed on new buffer contents equal to running it eagerly.

    python scripts/gpu/attention_kernels.py      # standalone
"""
from __future__ import annotations

import math
import sys

import torch

import common
from common import Report
from reference_engine.attention import TorchBackend
from reference_engine.worker.input_batch import StepInputs, make_batch
from reference_engine.attention.triton_backend import TritonBackend

TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 4e-3}
CASES = {  # name: (sequences as (cached, new), kv heads, group, head_dim, block size)
    "decode, GQA 4, D128": ([(0, 1), (16, 1), (299, 1), (1000, 1), (4095, 1)], 8, 4, 128, 16),
    "mixed: decode, verify k+1, prefill on cache, fresh prefill": (
        [(40, 1), (999, 1), (33, 4), (64, 80), (0, 37), (200, 300)], 8, 4, 128, 16),
    "MHA, D64, block 32": ([(5, 1), (77, 1), (0, 50), (31, 33)], 4, 1, 64, 32),
    "GQA 8, D128, block 8": ([(130, 1), (7, 1), (500, 9)], 8, 8, 128, 8),
}
SMOKE_CASES = {  # --smoke: Triton's interpreter on CPU is slow; small steps, same code
    "decode, GQA 4": ([(0, 1), (16, 1), (70, 1)], 2, 4, 32, 16),
    "mixed": ([(40, 1), (33, 4), (20, 30), (0, 9)], 2, 2, 32, 16),
}


def build(seqs, hkv, group, d, bs, dtype, seed):
    g = torch.Generator(device=common.DEVICE).manual_seed(seed)
    need = [-(-(c + n) // bs) for c, n in seqs]
    nblocks = sum(need) + 3
    perm = torch.randperm(nblocks, device=common.DEVICE, generator=g).tolist()
    tables, i = [], 0
    for nb in need:
        tables.append(perm[i:i + nb])
        i += nb
    shape = (nblocks, bs, hkv, d)
    kc = torch.randn(shape, device=common.DEVICE, generator=g).to(dtype)
    vc = torch.randn(shape, device=common.DEVICE, generator=g).to(dtype)
    step = [([0] * n, c, t) for (c, n), t in zip(seqs, tables)]
    n_tok = sum(n for _, n in seqs)
    return step, n_tok, kc, vc, g


def run_case(name, spec, dtype, splits, rep: Report, seed=0) -> None:
    seqs, hkv, group, d, bs = spec
    h = hkv * group
    step, n, kc, vc, g = build(seqs, hkv, group, d, bs, dtype, seed)
    decode_only = all(q == 1 for _, q in seqs)
    pad = n + 3 if decode_only else n
    q = torch.randn(pad, h, d, device=common.DEVICE, generator=g).to(dtype)
    k = torch.randn(pad, hkv, d, device=common.DEVICE, generator=g).to(dtype)
    v = torch.randn(pad, hkv, d, device=common.DEVICE, generator=g).to(dtype)
    scale = 1 / math.sqrt(d)
    ref_kv = [(kc.float().clone(), vc.float().clone())]
    ref = TorchBackend(ref_kv, bs).forward(0, q[:n].float(), k[:n].float(), v[:n].float(),
                                           make_batch(step, bs, common.DEVICE).meta, scale)
    inputs = StepInputs(pad, len(seqs) + 3, max(len(t) for _, _, t in step), bs, common.DEVICE, torch.int32)
    batch = inputs.fill(step, pad_to=len(seqs) + 3 if decode_only else None)
    tri_kv = [(kc.clone(), vc.clone())]
    out = TritonBackend(tri_kv, bs, num_splits=splits).forward(0, q, k, v, batch.meta, scale)[:n].float()
    err = (out - ref).abs().max().item() / max(1.0, ref.abs().max().item())
    what = f"kernels {name}, {str(dtype)[6:]}, splits {splits}: max error {err:.1e} (tol {TOL[dtype]:.0e})"
    rep.check(err <= TOL[dtype] and math.isfinite(err), what)
    same_cache = torch.equal(tri_kv[0][0], ref_kv[0][0].to(dtype)) and torch.equal(tri_kv[0][1], ref_kv[0][1].to(dtype))
    rep.check(same_cache, f"kernels {name}, {str(dtype)[6:]}, splits {splits}: KV cache written as the torch backend"
                          f"{' (3 padding tokens wrote nothing)' if decode_only else ''}")


def graph_replay(rep: Report, dtype=torch.bfloat16) -> None:
    """Capture a padded decode step of 8 over the step buffers; replay it after refilling them with 5
    other sequences; it must equal an eager run of those 5."""
    hkv, group, d, bs = 8, 4, 128, 16
    h = hkv * group
    first, n, kc, vc, g = build([(100, 1)] * 8, hkv, group, d, bs, dtype, 1)
    inputs = StepInputs(8, 8, 80, bs, common.DEVICE, torch.int32)
    backend = TritonBackend([(kc, vc)], bs)
    q = torch.randn(8, h, d, device=common.DEVICE, generator=g).to(dtype)
    k = torch.randn(8, hkv, d, device=common.DEVICE, generator=g).to(dtype)
    v = torch.randn(8, hkv, d, device=common.DEVICE, generator=g).to(dtype)
    meta = inputs.fill(first, pad_to=8).meta
    meta.num_splits = backend.graph_num_splits(8, 1280)
    meta.max_seq_len = 1280
    backend.new_step()
    backend.forward(0, q, k, v, meta, d ** -0.5)  # warm-up (compiles)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        backend.new_step()
        out = backend.forward(0, q, k, v, meta, d ** -0.5)
    tables = torch.randperm(kc.shape[0], device=common.DEVICE, generator=g)[:5 * 6].view(5, 6).tolist()
    second = [([0], c, t) for c, t in zip([3, 90, 17, 0, 61], tables)]
    inputs.fill(second, pad_to=8)
    kv_before = kc.clone()
    graph.replay()
    replayed = out[:5].clone()
    kc.copy_(kv_before)
    backend.new_step()
    eager = backend.forward(0, q[:5].clone(), k[:5].clone(), v[:5].clone(), inputs.fill(second).meta, d ** -0.5)
    rep.check(torch.allclose(replayed.float(), eager.float(), atol=2e-2, rtol=0),
              "kernels: a decode step captured in a CUDA graph, replayed on new buffer contents = eager")


def check_kernels(rep: Report) -> None:
    rep.section("Triton kernels vs the PyTorch backend on the GPU")
    n0, n1 = len(rep.failures), len(rep.passed)
    cases = SMOKE_CASES if common.SMOKE else CASES
    for i, (name, spec) in enumerate(cases.items()):
        # every shape in bf16; fp32 on the first two, fp16 on the second (each dtype is more compiles)
        for dtype in [torch.bfloat16] + [torch.float32] * (i < 2) + [torch.float16] * (i == 1):
            for splits in (None, 1, 5):
                run_case(name, spec, dtype, splits, rep)
    if common.DEVICE == "cuda":
        graph_replay(rep)
    bad = len(rep.failures) - n0
    rep.add(f"{bad + len(rep.passed) - n1} checks (step shapes x dtypes x split settings, outputs and KV writes, "
            f"+ one graph replay): {'all pass' if not bad else f'{bad} FAILED (see the log)'}", "")


if __name__ == "__main__":
    r = Report()
    check_kernels(r)
    sys.exit(1 if r.failures else 0)
