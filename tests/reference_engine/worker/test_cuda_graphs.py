"""CUDA-graph bucketing, padding and replay, on CPU.

Capture itself needs CUDA (scripts/gpu/check.sh runs it). Everything around it runs here: which
buckets are captured, which steps replay which bucket, and, with `EagerGraph` (a graph that re-runs
its recorded function on replay, reading the same persistent buffers a CUDA graph reads), that
padded replays give the tokens of eager steps. The Triton kernels run in Triton's interpreter (the
backend a graph captures); the `kernels` fixture comes from test_triton_backend.
"""
from __future__ import annotations

import pytest
import torch

from reference_engine import LLM, EngineConfig, SamplingParams
from reference_engine.config import default_cuda_graph_sizes
from reference_engine.worker.cuda_graphs import CudaGraphs, EagerGraph, bucket_for, capture_sizes, graphs_wanted, no_graphs
from reference_engine.model.make import make_model

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def test_default_sizes_are_vllms():
    assert default_cuda_graph_sizes() == [1, 2, 4] + list(range(8, 257, 8))
    assert default_cuda_graph_sizes(20) == [1, 2, 4, 8, 16]


def test_capture_sizes_cut_at_what_a_step_holds():
    assert capture_sizes([8, 1, 4, 4, 2, 300], max_num_seqs=128, max_num_batched_tokens=2048) == [1, 2, 4, 8]
    assert capture_sizes(default_cuda_graph_sizes(), max_num_seqs=12, max_num_batched_tokens=2048) == [1, 2, 4, 8]
    assert capture_sizes([1, 2, 4, 8], max_num_seqs=64, max_num_batched_tokens=3) == [1, 2]
    assert capture_sizes([], 64, 64) == []


@pytest.mark.parametrize("n, bucket", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8), (9, 16), (256, 256),
                                       (257, None)])
def test_bucket_is_the_smallest_size_that_fits(n, bucket):
    assert bucket_for(default_cuda_graph_sizes(), n) == bucket


def test_graphs_only_on_cuda_with_a_graph_safe_backend_unless_eager():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert graphs_wanted(cuda, enforce_eager=False, graph_safe=True)
    assert not graphs_wanted(cuda, enforce_eager=True, graph_safe=True)
    assert not graphs_wanted(cuda, enforce_eager=False, graph_safe=False)  # the torch backend
    assert not graphs_wanted(cpu, enforce_eager=False, graph_safe=True)


def test_enforce_eager_and_sizes_are_config_fields():
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        EngineConfig("m", cuda_graph_sizes=[0, 4])
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        EngineConfig("m", cuda_graph_sizes=4)
    with pytest.raises(ValueError, match="enforce_eager"):
        EngineConfig("m", enforce_eager="yes")
    from reference_engine.kernels import ops
    # CPU default: the C++ kernel where it builds, else the PyTorch backend; "triton" on CUDA
    from reference_engine.worker.backends import with_default_backends
    assert with_default_backends(EngineConfig("m")).attention_backend == ("cpu" if ops.available() else "torch")
    cuda = with_default_backends(EngineConfig("m", device="cuda"))
    assert cuda.attention_backend == "triton"  # (triton imports here)
    assert (cuda.linear_backend, cuda.fused_ops) == ("torch", False)  # the CPU kernels stay off on CUDA


def test_eager_graph_replays_what_it_recorded_over_current_buffers():
    buf, out = torch.zeros(4), torch.zeros(4)
    graphs = CudaGraphs(lambda b: out[:b].copy_(buf[:b] * 2), [1, 2, 4], torch.device("cpu"), eager=True)
    graphs.capture()
    assert sorted(graphs.graphs) == [1, 2, 4] and all(isinstance(g, EagerGraph) for g in graphs.graphs.values())
    buf[:] = torch.tensor([1.0, 5.0, 3.0, 9.0])  # a later step's inputs, written in place
    assert graphs.replay(graphs.bucket(3), 3).tolist() == [2.0, 10.0, 6.0]
    with no_graphs(graphs):
        assert graphs.bucket(1) is None
    assert graphs.bucket(5) is None and graphs.bucket(1) == 1


def test_cpu_engine_never_captures(tiny_llama):
    llm = LLM(str(tiny_llama), enforce_eager=False)
    assert llm.engine.runner.graphs is None
    assert llm.engine.effective_config()["cuda_graphs"] is False


# ---- padded replays vs eager steps, Triton kernels in the interpreter -------------------------
from tests.reference_engine.attention.test_triton_backend import kernels  # noqa: E402,F401  (module fixture)


def _engine(model, **kw):
    llm = LLM(str(model), attention_backend="triton", block_size=8, max_num_seqs=8, max_num_batched_tokens=64,
              max_model_len=128, cuda_graph_sizes=[1, 2, 4, 8], **kw)
    llm.engine.runner.capture_graphs(eager=True)
    return llm


def _count_replays(runner) -> list[int]:
    seen, replay = [], runner.graphs.replay

    def counting(b, n):
        seen.append((b, n))
        return replay(b, n)

    runner.graphs.replay = counting
    return seen


@pytest.mark.slow
def test_padded_graph_replays_match_eager_steps(kernels, tiny_qwen3):
    prompts = [[11, 12, 13, 14, 15], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40]]
    llm = _engine(tiny_qwen3)
    runner = llm.engine.runner
    assert sorted(runner.graphs.graphs) == [1, 2, 4, 8]
    seen = _count_replays(runner)
    graphed = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    assert (4, 3) in seen  # 3 decodes padded to bucket 4
    assert all(b >= n for b, n in seen)
    with no_graphs(runner.graphs):
        n = len(seen)
        eager = [o.token_ids for o in llm.generate(prompts, GREEDY)]
        assert len(seen) == n  # nothing replayed
    assert graphed == eager
    ref = LLM(str(tiny_qwen3), block_size=8, max_model_len=128)  # the torch backend, eager
    assert graphed == [o.token_ids for o in ref.generate(prompts, GREEDY)]


@pytest.mark.slow
def test_which_steps_replay(kernels, tmp_path):
    cyclic = make_model(tmp_path / "cyclic", preset="tiny", family="llama", cycle=3)  # greedy output repeats
    llm = _engine(cyclic, speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                              "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    runner = llm.engine.runner
    seen = _count_replays(runner)
    prompt = [40, 41, 42, 43, 44]
    out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0].token_ids
    with no_graphs(runner.graphs):
        assert llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0,
                                                     ignore_eos=True))[0].token_ids == out
    assert seen and llm.engine.num_drafts > 0  # both kinds of step happened
    assert all(b == 1 for b, _ in seen)  # only draft-free single decodes replay; verify steps run eagerly
    # eligibility, step by step: (sequences, logit rows, drafts, decodes)
    assert runner.graph_bucket(3, [0, 1, 2], {}, 3) == 4
    assert runner.graph_bucket(3, [0, 1, 2], {"r": [5]}, 3) is None  # drafts to verify
    assert runner.graph_bucket(2, [0, 9], {}, 1) is None  # a prefill chunk in the step
    assert runner.graph_bucket(3, [0, 1, 2], {}, 2) is None  # a prompt's one-token chunk: a prefill
    assert runner.graph_bucket(2, [1], {}, 2) is None  # a sequence that does not sample
    assert runner.graph_bucket(9, list(range(9)), {}, 9) is None  # above the largest bucket
    runner.draft_observes = True
    assert runner.graph_bucket(1, [0], {}, 1) is None  # a draft model runs on the step's inputs


def test_serve_flags_for_the_gpu_knobs():
    from reference_engine.server.cli import engine_config, parse

    cfg = engine_config(parse(["m", "--enforce-eager", "--cuda-graph-sizes", "1", "2", "8", "--load-format", "dummy",
                               "--attention-backend", "torch"]))
    assert cfg.enforce_eager is True and cfg.cuda_graph_sizes == [1, 2, 8] and cfg.load_format == "dummy"
    assert cfg.attention_backend == "torch"
    default = engine_config(parse(["m"]))
    assert default.enforce_eager is False and default.cuda_graph_sizes is None and default.gpu_memory_utilization is None
    cuda = engine_config(parse(["m", "--device", "cuda", "--gpu-memory-utilization", "0.8"]))
    assert cuda.gpu_memory_utilization == 0.8 and cuda.attention_backend is None  # chosen by the runner
