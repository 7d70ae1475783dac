"""The engine core: `LLMEngine` behind messages, and the one loop that drives it in a thread or a process.

vLLM's counterpart is `EngineCore` and `EngineCoreProc.run_busy_loop` (vllm/v1/engine/core.py): take
what the front end sent (block only when idle), apply it in order, step, send the step's outputs
back. The messages are messages.py's: `AddRequest` / `AbortRequest` / `Call` in, `CoreFacts` once
and then one `TurnOutput` per loop turn that did anything out. Both front ends run this same loop
(`run`): `AsyncEngine` in a thread over a `LocalInbox` (`thread_main`), `ProcessAsyncEngine` in a
child process over pipes (`core_main`).

The child process never outlives the front end. It asks the kernel for SIGKILL when its parent dies
(`prctl(PR_SET_PDEATHSIG)`, Linux; the parent is the thread that started it), so a front end killed
with -9 or by the OOM killer leaves no core holding the model's memory; elsewhere it exits at the
pipe's end. It ignores SIGINT and SIGTERM: Ctrl-C reaches the whole process group, and the front
end must first drain its streams, then send "stop".

Invariant: every request the core accepted ends with exactly one finished delta or one error in the
turn it leaves the engine (`EngineCore._ended`: a request that left without either gets an error
naming it), so no stream of a front end waits forever.
"""
from __future__ import annotations

import collections
import ctypes
import gc
import os
import signal
import sys
import time
from typing import Any

from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.engine.messages import AddRequest, Call, CoreFacts, TurnOutput, portable
from reference_engine.outputs import TokenDelta

BURST_GAP_S, BURST_MAX_S = 0.002, 0.010
WAVE_S, WAVE_MAX_S = 0.100, 0.030
# oneDNN's primitive cache and ideep's (torch's oneDNN wrapper) each keep up to 1,024 GEMMs by shape,
# each holding memory that grows with its row count; a server sees a new row count at almost every
# prefill, so the core's heap grew ~2 MiB per new one (SmolLM2, docs/perf/2026-12-04-soak-3.md).
# Linears take oneDNN on the fallback path (packed_linear: INFERLAB_LINEAR=onednn, bf16, no compiler).
# One step uses ~5 shapes per row count, so 16 entries still hit inside a step, for a bounded heap.
GEMM_CACHE_VARS, GEMM_CACHE_ENTRIES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"), "16"
# The runner keeps freed CPU memory in the heap (no trimming, so no page faults per prefill), so RSS held
# the largest batch's activations for good and stepped up with each new largest batch. A core idle this
# long hands the free pages back (`LLMEngine.release_idle_memory`) instead.
IDLE_TRIM_S = 0.5


def abort_delta(request_id: str) -> TokenDelta:
    return TokenDelta(request_id, [], "", finished=True, finish_reason="abort")


class EngineCore:
    """One `LLMEngine` driven by message batches: `turn(batch)` applies the batch in order, steps once if
    anything is unfinished, and returns the turn's `TurnOutput`."""

    def __init__(self, cfg, effective: dict | None = None):
        self.engine = LLMEngine(cfg)
        self.applied = 0
        self.running = True  # False after "stop" or a failure: the loop ends
        self.open: set[str] = set()  # requests accepted and not yet ended (by a finished delta or an error)
        # the idle-burst waits of `run`, read back with the engine's settings
        self._effective = {"burst_wait_ms": BURST_GAP_S * 1e3, "wave_wait_max_ms": WAVE_MAX_S * 1e3, **(effective or {})}

    def facts(self, **effective) -> CoreFacts:
        """What the front end answers from without asking; `effective`: settings the loop adds."""
        e = self.engine
        return CoreFacts(cfg=e.cfg, model_config=e.model_config, max_model_len=e.max_model_len,
                         kv_capacity_tokens=e.processor.kv_capacity_tokens, stats=e.stats(),
                         effective={**e.effective_config(), **self._effective, **effective}, pid=os.getpid())

    def turn(self, batch: list) -> TurnOutput:
        e, out, replies, step_s = self.engine, [], {}, 0.0
        for msg in batch:
            if isinstance(msg, Call):
                self.running = self.running and msg.name != "stop"
                replies[msg.call_id] = self._reply(msg)
            else:
                out += self._apply(msg)
                self.applied += 1
        if self.running and e.has_unfinished():
            t = time.monotonic()
            out += self._step()
            step_s = time.monotonic() - t
        out = self._ended(out)
        failure = e.failure
        self.running = self.running and not failure  # a dead TP rank: nothing left to step
        return TurnOutput([(r, portable(d) if isinstance(d, BaseException) else d) for r, d in out],
                          e.stats(), self.applied, replies, failure, step_s)

    def _apply(self, op) -> list[tuple[str, TokenDelta | BaseException]]:
        """An add (validated already, by the front end's InputProcessor) or an abort, between two steps."""
        e = self.engine
        if isinstance(op, AddRequest):
            try:
                e.enqueue(op.prompt_token_ids, op.params, op.request_id, cache_salt=op.cache_salt)
            except Exception as err:  # anything that still fails ends this stream alone
                return [(op.request_id, err)]
            self.open.add(op.request_id)
            return []
        return [(op.request_id, e.abort(op.request_id) or abort_delta(op.request_id))]

    def _step(self) -> list[tuple[str, TokenDelta | BaseException]]:
        """One step's deltas; a step that raises fails the in-flight requests (aborted, blocks freed) and
        the engine keeps serving."""
        e = self.engine
        try:
            return [(d.request_id, d) for d in e.step()]
        except Exception as err:  # a bug in a step
            failed = []
            for rid in list(e.requests):
                try:
                    e.abort(rid)
                except Exception:  # a request the failed step left half-finished: it is gone either way
                    e.requests.pop(rid, None)
                failed.append((rid, RuntimeError(f"engine step failed: {err!r}")))
            return failed

    def _ended(self, out: list) -> list:
        """`out`, plus an error for each accepted request that left the engine without a finished delta
        or an error (the invariant in the module docstring); each is named on stderr."""
        for rid, d in out:
            if isinstance(d, BaseException) or d.finished:
                self.open.discard(rid)
        lost = [rid for rid in self.open if rid not in self.engine.requests]
        for rid in lost:
            print(f"inferlab engine core: request {rid!r} left the engine without an end; ending its stream "
                  "with an error", file=sys.stderr, flush=True)
            self.open.discard(rid)
            out.append((rid, RuntimeError(f"the engine dropped request {rid!r} without finishing it")))
        return out

    def _reply(self, call: Call) -> Any:
        e = self.engine
        if call.name == "stop":
            for rid in list(e.requests):
                e.abort(rid)
            self.open.clear()  # the front end ends its streams itself on shutdown
            return None
        try:
            return getattr(e, call.name)(*call.args)
        except Exception as err:
            return err

    def close(self) -> None:
        self.engine.close()


def run(core: EngineCore, inbox, outbox) -> None:
    """The loop: take messages (block only when idle), apply them in order, step, send one `TurnOutput`
    per turn. Ends after "stop" or a failure; `inbox` / `outbox`: a pipe's ends or a `LocalInbox` and the
    thread front end's sender."""
    stepped = False
    finished: collections.deque = collections.deque()  # when each recent request finished
    while core.running:
        now = time.monotonic()
        while finished and finished[0] < now - WAVE_S:
            finished.popleft()
        batches = []
        if not core.engine.has_unfinished():
            if stepped and not inbox.poll(IDLE_TRIM_S):  # idle: nothing came in IDLE_TRIM_S
                core.engine.release_idle_memory()
                stepped = False
                finished.clear()  # a wave long past: the next burst expects nothing
            batches = _burst(inbox, expect=len(finished))
        while inbox.poll():
            batches.append(inbox.recv())
        out = core.turn([m for b in batches for m in b])
        if out.step_s:
            stepped = True
            done = time.monotonic()
            finished.extend(done for _, d in out.deltas if getattr(d, "finished", False))
        outbox.send(out)


def _burst(inbox, expect: int = 0) -> list:
    """An idle core's first message, and whatever follows it within `BURST_GAP_S` of the previous
    one (at most `BURST_MAX_S` in all): requests that clients send together (a burst) reach the
    front end over a few milliseconds; stepping the first one alone would make the rest wait a
    whole prefill step. Costs an idle server's first request 2 ms. With `expect` > 1 (that many
    requests finished just before the core went idle: a closed loop's wave) it also waits, up to
    `WAVE_MAX_S` in all, until `expect` new requests have come."""
    batches = [inbox.recv()]
    adds = sum(isinstance(m, AddRequest) for m in batches[0])
    deadline = time.monotonic() + (WAVE_MAX_S if expect > 1 else BURST_MAX_S)
    while (left := deadline - time.monotonic()) > 0:
        if not inbox.poll(left if adds < expect else min(left, BURST_GAP_S)):
            break
        batches.append(inbox.recv())
        adds += sum(isinstance(m, AddRequest) for m in batches[-1])
    return batches


def thread_main(cfg, inbox, outbox) -> None:
    """The core in a thread of the front end's process (`AsyncEngine`): build, send the facts (or the
    start-up exception), loop; a loop that raises sends its failure."""
    try:
        core = EngineCore(cfg, {"engine_process": False})
    except BaseException as e:
        outbox.send(e)
        return
    outbox.send(core.facts())
    try:
        run(core, inbox, outbox)
    except Exception as e:  # the loop itself broke: the front end fails every stream and reports the death
        outbox.send(TurnOutput([], core.engine.stats(), core.applied, failure=f"the engine loop died: {e!r}"))
    finally:
        core.close()


def die_with_parent(parent: int | None) -> None:
    """SIGKILL this process when its parent dies (Linux); a parent already gone: exit now.
    None (a forkserver's child: its parent is the server, not the front end) skips it."""
    if parent is None:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the pipe's end is the signal (core_main's EOFError)
    if os.getppid() != parent:  # it died before the prctl took effect
        os._exit(1)


def bound_gemm_caches() -> dict[str, str]:
    """Cap the oneDNN and ideep GEMM caches at `GEMM_CACHE_ENTRIES` unless the user set them; both
    read their variable at their first GEMM, so this must run before the model is built (packing
    runs GEMMs). Returns the values in force."""
    return {v: os.environ.setdefault(v, GEMM_CACHE_ENTRIES) for v in GEMM_CACHE_VARS}


def core_main(cfg, inbox, outbox, front_ends: tuple, parent: int | None, cpus: tuple[int, ...] | None = None) -> None:
    """The child process (`ProcessAsyncEngine`): build the core, send its facts, loop. Exits on "stop"
    or when the front end is gone. `cpus`: the CPUs it runs on (a data-parallel replica's own cores),
    set before torch starts any thread."""
    die_with_parent(parent)
    if cpus:
        os.sched_setaffinity(0, cpus)
    for c in front_ends:  # forked: our copies of the front's ends, or EOF would never come
        c.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front drains requests on SIGINT/SIGTERM, then stops us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    caches = bound_gemm_caches()
    try:
        core = EngineCore(cfg, {"engine_process": True, "gemm_cache_entries": caches,
                                "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None})
    except BaseException as e:
        outbox.send(portable(e))
        return
    # Everything built so far (torch, the model's modules, the kernels: ~300k objects for SmolLM2)
    # lives as long as the process: out of the cyclic GC's sight. A full pass over it took ~200 ms,
    # inside whatever step it lands in; rare (60 s of SmolLM2 steps in process saw none), but a
    # long-running server gets there. vLLM's EngineCore does the same after its start-up
    # (vllm/v1/engine/core.py, `freeze_gc_heap` in vllm/utils/gc_utils.py, 0.32).
    gc.collect()
    gc.freeze()
    outbox.send(core.facts(gc_frozen_objects=gc.get_freeze_count()))
    try:
        run(core, inbox, outbox)
    except (EOFError, OSError):
        pass  # the front end is gone
    finally:
        core.close()
