"""`LLM` with tensor_parallel_size=2 stops its worker rank when it is dropped, at the end of a `with`
block, or at `close()` (idempotent), instead of leaving it alive with its weights until exit."""
from __future__ import annotations

import gc

import psutil

from reference_engine import LLM, SamplingParams


def tp_llm(model) -> LLM:
    return LLM(str(model), tensor_parallel_size=2, kv_cache_tokens=256)


def workers(llm: LLM) -> list[int]:
    pids = [p.pid for p in llm.engine.runner.tp.procs]
    assert pids and all(psutil.pid_exists(p) for p in pids)
    return pids


def gone(pids: list[int], timeout: float = 120) -> bool:
    """Every pid has exited within `timeout` s each (a zombie counts as exited: it holds no memory)."""
    for pid in pids:
        try:
            psutil.Process(pid).wait(timeout=timeout)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            return False
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_dropping_the_last_reference_stops_the_workers(tiny_llama):
    llm = tp_llm(tiny_llama)
    pids = workers(llm)
    assert len(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))[0].token_ids) == 2
    del llm
    gc.collect()
    assert gone(pids)


def test_a_with_block_stops_them_and_close_may_be_called_again(tiny_llama):
    with tp_llm(tiny_llama) as llm:
        pids = workers(llm)
    assert gone(pids)
    llm.close()
    llm.engine.close()
    assert llm.engine.runner.tp.procs[0].poll() is not None
