"""Triton attention kernels vs the PyTorch backend, on CPU under Triton's interpreter.

Triton decides interpreter vs compiler when `@triton.jit` decorates, i.e. when
`reference_engine.attention.triton_kernels` is imported; the `kernels` fixture imports it with
TRITON_INTERPRET=1 (reloading it if an earlier test imported it compiled) and restores both the
variable and the module afterwards, so nothing else in the session runs interpreted.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from reference_engine import attention
from reference_engine.attention import registry  # noqa: F401  (attention.registry below)
from reference_engine.attention import AttentionMetadata, TorchBackend

triton = pytest.importorskip("triton", reason="triton is not installed (pip install 'triton==3.7.1')")
from reference_engine.attention import triton_backend as ta  # noqa: E402

KERNELS = "reference_engine.attention.triton_kernels"
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module", autouse=True)
def kernels():
    before = sys.modules.get(KERNELS)
    compiled_before = before is not None and not before.INTERPRETED
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        mod = importlib.reload(before) if compiled_before else importlib.import_module(KERNELS)
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    assert mod.INTERPRETED
    yield mod
    if compiled_before:  # give the rest of the session its compiled kernels back
        importlib.reload(mod)


@dataclass
class Case:
    meta: AttentionMetadata
    q: torch.Tensor  # (N, H, D)
    k: torch.Tensor  # (N, Hkv, D), a strided view like the model's fused qkv split
    v: torch.Tensor
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # one layer, (num_blocks, block_size, Hkv, D) each
    block_size: int


def make_case(seqs: list[tuple[int, int]], *, block_size: int = 16, kv_heads: int = 2, group: int = 2,
              head_dim: int = 32, dtype=torch.float32, spare_blocks: int = 5, seed: int = 0) -> Case:
    """seqs: (cached context, new query tokens) per sequence; decodes (1 token) must come first.

    Every cache block starts out random, so reading a wrong block or a slot past a sequence's
    length changes the result; block ids are a random permutation (non-contiguous, id 0 used)."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-(c + n) // block_size) for c, n in seqs]
    num_blocks = sum(need) + spare_blocks
    ids = torch.randperm(num_blocks, generator=g).tolist()
    tables, i = [], 0
    for nb in need:
        tables.append(ids[i:i + nb])
        i += nb
    width = max(need)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int64)
    slots = [t[p // block_size] * block_size + p % block_size
             for (c, n), t in zip(seqs, tables) for p in range(c, c + n)]
    q_lens = [n for _, n in seqs]
    seq_lens = [c + n for c, n in seqs]
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    nd = 0
    while nd < len(q_lens) and q_lens[nd] == 1:
        nd += 1
    assert all(n > 1 for n in q_lens[nd:]), "decodes first, as the runner orders them"
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64), block_tables=block_tables,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64), query_lens=q_lens, seq_lens_list=seq_lens,
        query_start=starts, num_decodes=nd, max_decode_len=max(seq_lens[:nd], default=0))
    h, n_tok, d = kv_heads * group, starts[-1], head_dim
    qkv = torch.randn(n_tok, (h + 2 * kv_heads) * d, generator=g).to(dtype)
    q, k, v = qkv.split([h * d, kv_heads * d, kv_heads * d], dim=-1)
    shape = (num_blocks, block_size, kv_heads, d)
    kv = [(torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype))]
    return Case(meta, q.reshape(n_tok, h, d), k.reshape(n_tok, kv_heads, d), v.reshape(n_tok, kv_heads, d),
                kv, block_size)


def against_torch(case: Case, make_backend):
    """Same inputs through `make_backend(kv, block_size)` and the PyTorch backend, each on its own
    copy of the cache; (out, ref). Shared with the CPU kernel's tests."""
    scale = case.q.shape[-1] ** -0.5
    kv_ref = [(k.clone(), v.clone()) for k, v in case.kv]
    kv_new = [(k.clone(), v.clone()) for k, v in case.kv]
    ref = TorchBackend(kv_ref, case.block_size).forward(0, case.q, case.k, case.v, case.meta, scale)
    out = make_backend(kv_new, case.block_size).forward(0, case.q, case.k, case.v, case.meta, scale)
    # the backend wrote exactly what index_copy_ wrote into the cache, and nothing else
    assert torch.equal(kv_new[0][0], kv_ref[0][0]) and torch.equal(kv_new[0][1], kv_ref[0][1])
    return out, ref


def run_both(case: Case, **triton_opts):
    return against_torch(case, lambda kv, bs: ta.TritonBackend(kv, bs, **triton_opts))


def assert_close(out, ref, dtype, tol=TOL):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    rel = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert rel < tol[dtype], f"relative error {rel:.2e} >= {tol[dtype]:.0e}"


SMALL = dict(block_r=16, block_n=16)  # small tiles: several query blocks and key tiles per sequence

# decodes whose context ends on / around block boundaries (16 = block_size), then a prompt from
# scratch, a chunk on two prefix-cached blocks, a later chunk crossing a boundary, and a
# speculative-verification chunk (k+1 = 4 tokens) on cached context
MIXED = [(15, 1), (16, 1), (31, 1), (0, 23), (32, 9), (15, 18), (40, 4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_mixed_batch_matches_torch(group, dtype):
    case = make_case(MIXED, group=group, dtype=dtype, seed=group)
    assert_close(*run_both(case, **SMALL), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_split_k_decode_matches_torch(splits, dtype):
    """Flash-decoding: 8 splits of a 3-tile context leave some splits empty."""
    case = make_case([(99, 1), (63, 1), (32, 1), (47, 1)], group=4, dtype=dtype, seed=splits)
    assert_close(*run_both(case, num_splits=splits, **SMALL), dtype)


def test_split_k_on_mixed_batch():
    """Splits over prefill chunks too: rows whose every key in a split is masked contribute nothing."""
    case = make_case(MIXED, group=2, seed=7)
    assert_close(*run_both(case, num_splits=4, **SMALL), torch.float32)


@pytest.mark.parametrize("block_size", [12, 32])
def test_cache_block_size_other_than_key_tile(block_size):
    """Key tiles of 16 spanning parts of 12-slot blocks, or halves of 32-slot blocks."""
    b = block_size
    seqs = [(b - 1, 1), (b, 1), (2 * b, 1), (b + 1, b - 1), (b // 2, b + 2), (2 * b - 2, 3)]
    case = make_case(seqs, block_size=b, group=2, seed=b)
    assert_close(*run_both(case, **SMALL), torch.float32)


def test_default_tiles_odd_head_dim_and_group():
    """The GPU tile sizes (64 rows, 64 keys), head_dim 24 (padded to 32) and 3 query heads per kv head."""
    case = make_case(MIXED, kv_heads=2, group=3, head_dim=24, seed=3)
    assert_close(*run_both(case), torch.float32)
    decode_only = make_case([(70, 1), (5, 1), (16, 1)], kv_heads=2, group=3, head_dim=24, seed=4)
    assert_close(*run_both(decode_only), torch.float32)


@pytest.mark.parametrize("seed", range(4))
def test_random_batches(seed):
    g = torch.Generator().manual_seed(100 + seed)

    def r(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    decodes = [(r(0, 60), 1) for _ in range(r(0, 4))]
    chunks = [(r(0, 50), r(2, 30)) for _ in range(r(1, 4))]
    case = make_case(decodes + chunks, block_size=[8, 16][r(0, 2)], kv_heads=r(1, 3), group=[1, 2, 4][r(0, 3)],
                     seed=seed)
    assert_close(*run_both(case, num_splits=r(1, 4), **SMALL), torch.float32)


def test_store_skips_padding_slots():
    """slot -1 (a padded token, as CUDA-graph padding will use) writes nothing."""
    k_cache = torch.zeros(4, 8, 2, 16)
    v_cache = torch.zeros(4, 8, 2, 16)
    k, v = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    ta.store_kv(k, v, k_cache, v_cache, torch.tensor([9, -1, 31]))
    assert torch.equal(k_cache.view(-1, 2, 16)[9], k[0]) and torch.equal(v_cache.view(-1, 2, 16)[31], v[2])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 2


def test_plan_reused_across_layers_and_rebuilt_per_step():
    case = make_case([(20, 1), (0, 5)], seed=5)
    backend = ta.TritonBackend(case.kv, case.block_size)
    scale = case.q.shape[-1] ** -0.5
    backend.forward(0, case.q, case.k, case.v, case.meta, scale)
    plan = backend._plan
    assert plan.cu_q.tolist() == [0, 1, 6] and plan.seq_lens.dtype == torch.int32
    backend.forward(0, case.q, case.k, case.v, case.meta, scale)
    assert backend._plan is plan
    other = make_case([(20, 1), (0, 5)], seed=6)
    backend.forward(0, other.q, other.k, other.v, other.meta, scale)
    assert backend._plan is not plan


def test_num_splits_heuristic(monkeypatch):
    cpu = torch.device("cpu")
    assert ta.pick_num_splits(programs=4, max_seq_len=100_000, device=cpu) == 1  # "1 SM": grid fills it
    monkeypatch.setattr(ta, "_num_sms", lambda device: 132)
    assert ta.pick_num_splits(programs=16, max_seq_len=8192, device=cpu) == 17  # ~2 programs per SM
    assert ta.pick_num_splits(programs=16, max_seq_len=1024, device=cpu) == 4  # >= 256 keys per split
    assert ta.pick_num_splits(programs=16, max_seq_len=300, device=cpu) == 1  # short: no split
    assert ta.pick_num_splits(programs=2, max_seq_len=1 << 20, device=cpu) == ta.MAX_SPLITS
    assert ta.pick_num_splits(programs=264, max_seq_len=1 << 20, device=cpu) == 1  # decode batch fills it


def test_registered_and_default_picker():
    assert attention.get_backend("triton") is ta.TritonBackend
    from reference_engine.kernels import ops
    assert attention.default_attention_backend("cpu") == ("cpu" if ops.available() else "torch")
    assert attention.default_attention_backend("cuda:0") == "triton"  # triton imports here


def test_missing_triton_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(ta, "triton_available", lambda: False)
    monkeypatch.delitem(attention.registry.BACKENDS, "triton", raising=False)
    with pytest.raises(ImportError) as e:
        attention.get_backend("triton")
    assert "\n" not in str(e.value) and "pip install 'triton==" in str(e.value)
    assert attention.default_attention_backend("cuda") == "torch"


def test_engine_imports_without_triton():
    """A Python where `import triton` fails: the engine imports, picks torch, and "triton" says what to install."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import reference_engine, reference_engine.worker.model_runner\n"
        "from reference_engine.attention import get_backend\n"
        "from reference_engine.attention import default_attention_backend\n"
        "assert default_attention_backend('cuda') == 'torch'\n"
        "try:\n    get_backend('triton')\nexcept ImportError as e:\n    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("attention backend 'triton' needs the triton package: pip install")


def test_compiled_kernels_refuse_cpu_cache(kernels, monkeypatch):
    monkeypatch.setattr(kernels, "INTERPRETED", False)
    with pytest.raises(ValueError, match="needs the KV cache on CUDA"):
        ta.TritonBackend([(torch.zeros(1, 16, 1, 8), torch.zeros(1, 16, 1, 8))], 16)


@pytest.mark.slow
def test_engine_greedy_tokens_match_torch_backend(tiny_llama):
    """The whole engine on the tiny model (GQA 4): chunked prefill + decodes, same greedy tokens."""
    from reference_engine import LLM, SamplingParams

    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompts = [[11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29], [30, 31, 32]]
    outs = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(tiny_llama), attention_backend=backend, max_num_batched_tokens=16, block_size=8)
        outs[backend] = [o.token_ids for o in llm.generate(prompts, params)]
    assert outs["triton"] == outs["torch"]


def _compile(kernel, types: dict[str, str], consts: dict, arch: int):
    """Compile a kernel to a cubin for sm_`arch` with triton's bundled ptxas: no GPU needed."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    fn = JITFunction(kernel.fn)  # the fixture made the module's kernels interpreted; compile the source
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    return triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", arch, 32))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_kernels_compile_for_gpus(kernels, dtype):
    """The compiled (non-interpreter) path: every kernel, with the tiles the backend picks for a
    Llama-8B-like layer (32 heads, 8 kv heads, head_dim 128), lowers to cubin for sm_80 and sm_90
    and fits sm_86's 99 KB of shared memory."""
    from triton.runtime.jit import JITFunction

    if not isinstance(triton.language.standard._elementwise_max, JITFunction):
        pytest.skip("triton itself was imported with TRITON_INTERPRET=1: its helpers cannot compile")
    el = {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
    cu, lens = torch.tensor([0, 1, 2, 300], dtype=torch.int32), torch.tensor([900, 40, 300])
    prefill = ta.plan_step(cu, lens, 298, 900, 300, 32, 8, 128, dtype)
    decode = ta.plan_step(cu[:3], lens[:2], 1, 900, 2, 32, 8, 128, dtype, num_splits=8)
    types = {n: f"*{el}" for n in ["q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr", "k_ptr", "v_ptr"]}
    types.update(part_o_ptr="*fp32", part_lse_ptr="*fp32", block_tables_ptr="*i32", seq_lens_ptr="*i32",
                 cu_q_ptr="*i32", cu_qblk_ptr="*i32", scale_log2="fp32", slot_ptr="*i64")
    for arch in (80, 90):
        for plan in (prefill, decode):
            c = _compile(kernels.paged_attention_kernel, types, dict(
                GROUP=4, BLOCK_M=plan.block_m, BLOCK_R=plan.block_r, BLOCK_N=plan.block_n, BLOCK_D=128,
                SPLIT=plan.num_splits > 1, UPCAST=False, DOT_PRECISION="ieee" if el == "fp32" else None), arch)
            assert c.metadata.shared <= 99 * 1024, (plan, c.metadata.shared)
    _compile(kernels.merge_splits_kernel, types, dict(BLOCK_H=4, BLOCK_S=8, BLOCK_D=128), 90)
    _compile(kernels.store_kv_kernel, types, dict(BLOCK_T=4, BLOCK_H=8, BLOCK_D=128), 90)
