"""Tensor parallelism, 2 ranks over gloo on CPU: the same fp32 greedy tokens as one rank (prefix caching
and n-gram speculation on), each rank holding half of the sharded weights, and a killed rank ending
the engine with a clear error and no process left behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from reference_engine.model.packed_linear import PackedLinear
from reference_engine import LLM, SamplingParams
from reference_engine.distributed.group import RankFailure

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SHARDED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
PATTERN = [1, 5, 9, 13, 200, 7]
FIRST = [PATTERN * 4 + [31, 32]]  # 26 tokens: its first block is cached for the second batch
SECOND = [PATTERN * 4 + [40], PATTERN * 3 + [3, 4, 5, 6] * 3, [3, 4, 5, 6] * 5 + [9]]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def generate(llm: LLM) -> list[list[int]]:
    """Two batches, so the second hits the first's cached prefix."""
    return [o.token_ids for batch in (FIRST, SECOND) for o in llm.generate(batch, GREEDY)]


def engine(model, tp: int) -> LLM:
    return LLM(str(model), tensor_parallel_size=tp, kv_cache_tokens=2048, speculative_config=SPEC)


def sharded_bytes(llm: LLM) -> int:
    """Bytes held for the sharded projections: their parameters, and their packed layouts where the CPU
    holds them packed (with one layout per weight the panels are all there is)."""
    model = llm.engine.runner.model
    held = [*model.named_parameters(), *model.named_buffers()]  # a PackedLinear's bias is a buffer
    layouts = [m for n, m in model.named_modules()  # a row-parallel layer's GEMM is its `.mm`
               if isinstance(m, PackedLinear) and any(f".{s}." in n + "." for s in SHARDED)]
    packed = {id(t) for m in layouts for t in (m.panels, m.packed) if t is not None}
    return sum(m.packed_bytes() for m in layouts) + sum(
        t.numel() * t.element_size() for n, t in held if any(f".{s}." in n for s in SHARDED) and id(t) not in packed)


def weight_total(llm: LLM) -> int:
    """Everything the engine holds for weights: the parameters plus every layout (memory_report)."""
    mem = llm.engine.memory_report()
    return mem["weights"] + sum(v for k, v in mem.items() if k.startswith("layout_"))


def gone(pids: list[int]) -> bool:
    """Every pid has exited (waits for each, so that a dying process is not counted as alive)."""
    for pid in pids:
        try:
            psutil.Process(pid).wait(timeout=30)
        except psutil.NoSuchProcess:
            pass
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


@pytest.fixture(scope="module")
def llama_tp(tiny_llama):
    llm = engine(tiny_llama, 2)
    yield llm
    llm.engine.close()


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_two_ranks_emit_the_tokens_of_one(make_tiny, llama_tp, family):
    one = engine(make_tiny(family), 1)
    want, want_sharded, want_weights = generate(one), sharded_bytes(one), weight_total(one)
    two = llama_tp if family == "llama" else engine(make_tiny(family), 2)
    try:
        assert generate(two) == want
        eng = two.engine
        assert eng.effective_config()["tensor_parallel_size"] == 2
        s = eng.stats()
        assert s.prefix_cache_hits > 0 and s.spec_decode_num_draft_tokens > 0  # both paths ran
        # rank 0 timed its plain decode steps: each all-reduces (rows, hidden) fp32 twice per layer
        mc = eng.model_config
        assert s.tp_decode_steps > 0 and 0 < s.tp_decode_allreduce_seconds < s.tp_decode_seconds
        assert s.tp_decode_allreduce_bytes > 0 and s.tp_decode_allreduce_bytes % (2 * mc.num_layers * mc.hidden_size * 4) == 0
        mem = eng.memory_report()
        per_rank = [mem["weights_rank0"], mem["weights_rank1"]]
        # 8 heads in 2 kv groups, intermediate 1024: an even split, so each rank holds exactly half of
        # the sharded tensors, plus the replicated rest (embedding, norms, LM head, rotary tables)
        assert per_rank == [want_weights - want_sharded // 2] * 2
        assert sharded_bytes(two) == want_sharded // 2
    finally:
        if two is not llama_tp:
            two.engine.close()


def test_killed_rank_ends_the_engine_with_a_clear_error(llama_tp):
    eng = llama_tp.engine
    for p in SECOND:
        eng.add_request(p, SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
    eng.step()
    eng.step()  # mid-run: requests running, KV held on both ranks
    worker = eng.runner.tp.procs[0]
    os.kill(worker.pid, signal.SIGKILL)
    with pytest.raises(RankFailure, match=r"rank 1 \(pid \d+\) exited with code -9"):
        for _ in range(1000):  # the watchdog or the next collective notices; it never hangs
            eng.step()
    assert eng.failure and "rank 1" in eng.failure
    with pytest.raises(RankFailure):  # and stays failed
        eng.step()
    assert gone([worker.pid])


RANK0 = """
import sys, time
from reference_engine import LLM
llm = LLM(sys.argv[1], tensor_parallel_size=2, kv_cache_tokens=256)
print(*[p.pid for p in llm.engine.runner.tp.procs], flush=True)
time.sleep(600)
"""


def test_worker_ranks_die_with_rank_zero(tiny_llama):
    """Rank 0 killed by SIGKILL (no handler, no atexit runs): its workers exit too, no orphan rank.
    (SIGTERM without a handler ends the process the same way; the server's SIGTERM closes the engine.)"""
    p = subprocess.Popen([sys.executable, "-c", RANK0, str(tiny_llama)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(x) for x in p.stdout.readline().split()]
        assert workers and all(psutil.pid_exists(w) for w in workers)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=60)
        assert gone(workers)
    finally:
        p.kill()
        p.wait()
