"""The engine core's side of `ProcessAsyncEngine` (engine_process.py): the child process's busy loop.

vLLM's counterpart is `EngineCoreProc.run_busy_loop` (vllm/v1/engine/core.py): take what the front
end sent (block only when idle), apply it in order, step, send the step's outputs back. Messages are
typed: `AddRequest` / `AbortRequest` (async_engine.py) and `Call` in; one `TurnOutput` per loop turn
that did anything out.

The child never outlives the front end. It asks the kernel for SIGKILL when its parent dies
(`prctl(PR_SET_PDEATHSIG)`, Linux; the parent is the thread that started it), so a front end killed
with -9 or by the OOM killer leaves no core holding the model's memory; elsewhere it exits at the
pipe's end, as before. It ignores SIGINT and SIGTERM: Ctrl-C reaches the whole process group, and
the front end must first drain its streams, then send "stop".
"""
from __future__ import annotations

import collections
import ctypes
import gc
import os
import pickle
import signal
import struct
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from reference_engine.engine.async_engine import AddRequest, apply_ops, step_or_fail
from reference_engine.engine.llm_engine import EngineStats, LLMEngine
from reference_engine.outputs import TokenDelta
from reference_engine.worker.gpu_memory import release_freed_cpu_memory

BURST_GAP_S, BURST_MAX_S = 0.002, 0.010
WAVE_S, WAVE_MAX_S = 0.100, 0.030
# oneDNN's primitive cache and ideep's (torch's oneDNN wrapper) each keep up to 1,024 GEMMs by shape,
# each holding memory that grows with its row count; a server sees a new row count at almost every
# prefill, so the core's heap grew ~2 MiB per new one (SmolLM2, docs/perf/2026-12-04-soak-3.md).
# Linears take oneDNN on the fallback path (packed_linear: INFERLAB_LINEAR=onednn, bf16, no compiler).
# One step uses ~5 shapes per row count, so 16 entries still hit inside a step, for a bounded heap.
GEMM_CACHE_VARS, GEMM_CACHE_ENTRIES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"), "16"
# The runner keeps freed CPU memory in the heap (gpu_memory.keep_freed_cpu_memory: no trimming, so no
# page faults per prefill), so RSS held the largest batch's activations for good and stepped up with
# each new largest batch. A core idle this long hands the free pages back (`release_freed_cpu_memory`) instead.
IDLE_TRIM_S = 0.5


@dataclass(frozen=True)
class Call:
    """Front -> core: run `LLMEngine.<name>(*args)` between two steps and reply with its result
    ("stop": abort everything and exit)."""
    call_id: int
    name: str
    args: tuple = ()


@dataclass
class TurnOutput:
    """Core -> front, once per loop turn that did anything."""
    deltas: list[tuple[str, TokenDelta | BaseException]]
    stats: EngineStats
    applied: int  # ops applied since start (the front forgets that many of those it sent)
    replies: dict[int, Any] = field(default_factory=dict)  # call_id -> result or exception
    failure: str | None = None  # the core can no longer step (LLMEngine.failure, tensor parallel)
    step_s: float = 0.0  # how long this turn's step took (the front's watchdog scales with the longest)


def portable(e: BaseException) -> BaseException:
    """An exception that survives pickling (its type when it can, its repr otherwise)."""
    try:
        return pickle.loads(pickle.dumps(e))
    except Exception:
        return RuntimeError(repr(e))


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


def core_main(cfg, inbox, outbox, front_ends: tuple, parent: int | None) -> None:
    """The child: build the core, report its facts, then loop: take messages (block only when
    idle), apply them in order, step, send one `TurnOutput`. Exits on "stop" or when the front is gone."""
    die_with_parent(parent)
    for c in front_ends:  # forked: our copies of the front's ends, or EOF would never come
        c.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front drains requests on SIGINT/SIGTERM, then stops us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    caches = bound_gemm_caches()
    try:
        core = LLMEngine(cfg)
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
    outbox.send(SimpleNamespace(cfg=core.cfg, model_config=core.model_config, max_model_len=core.max_model_len,
                                kv_capacity_tokens=core.runner.kv_capacity_tokens, stats=core.stats(),
                                effective={**core.effective_config(), "gc_frozen_objects": gc.get_freeze_count(),
                                           "gemm_cache_entries": caches},
                                pid=os.getpid()))
    try:
        _loop(core, inbox, outbox)
    except (EOFError, OSError):
        pass  # the front end is gone
    finally:
        if hasattr(core, "close"):
            core.close()


def _loop(core: LLMEngine, inbox, outbox) -> None:
    applied, running, stepped = 0, True, False
    finished: collections.deque = collections.deque()  # when each recent request finished
    while running:
        now = time.monotonic()
        while finished and finished[0] < now - WAVE_S:
            finished.popleft()
        batches = []
        if not core.has_unfinished():
            if stepped and not inbox.poll(IDLE_TRIM_S):  # idle: nothing came in IDLE_TRIM_S
                release_freed_cpu_memory()
                stepped = False
                finished.clear()  # a wave long past: the next burst expects nothing
            batches = _burst(inbox, expect=len(finished))
        while inbox.poll():
            batches.append(inbox.recv())
        out, replies, step_s = [], {}, 0.0
        for msg in (m for b in batches for m in b):
            if isinstance(msg, Call):
                running = running and msg.name != "stop"
                replies[msg.call_id] = _reply(core, msg)
            else:
                out += apply_ops(core, [msg])
                applied += 1
        if running and core.has_unfinished():
            stepped = True
            t = time.monotonic()
            out += step_or_fail(core)
            done = time.monotonic()
            step_s = done - t
            finished.extend(done for _, d in out if getattr(d, "finished", False))
        outbox.send(TurnOutput([(r, portable(d) if isinstance(d, BaseException) else d) for r, d in out],
                               core.stats(), applied, replies, getattr(core, "failure", None), step_s))
        running = running and not getattr(core, "failure", None)  # a dead TP rank: nothing left to step


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


def _reply(core: LLMEngine, call: Call) -> Any:
    if call.name == "stop":
        for rid in list(core.requests):
            core.abort(rid)
        return None
    try:
        return getattr(core, call.name)(*call.args)
    except Exception as e:
        return portable(e)


class Frames:
    """Whole messages from the core's end of the pipe, read without ever blocking the event loop.
    `Connection.recv` waits for the rest of a message once its first bytes arrived, so a core stopped
    (SIGSTOP, a debugger) or stuck in the middle of a send would freeze every stream and /health with
    it. This reads what is there and unpickles the complete frames, in multiprocessing's framing
    (`Connection._send_bytes`: a 4-byte big-endian length, or -1 and an 8-byte one, then the pickle)."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, bytearray()
        os.set_blocking(fd, False)

    def read(self) -> tuple[list, bool]:
        """(the complete messages now, whether the core's end is closed)"""
        ended = False
        while True:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                ended = True
                break
            self.buf += chunk
        out = []
        while len(self.buf) >= 4:
            (n,), head = struct.unpack("!i", self.buf[:4]), 4
            if n == -1:
                if len(self.buf) < 12:
                    break
                (n,), head = struct.unpack("!Q", self.buf[4:12]), 12
            if len(self.buf) < head + n:
                break
            out.append(pickle.loads(self.buf[head:head + n]))
            del self.buf[:head + n]
        return out, ended
