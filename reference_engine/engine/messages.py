"""What crosses the boundary between an engine front end and its core, in both directions.

The front ends (`async_engine.AsyncEngine`, the core in a thread; `engine_process.ProcessAsyncEngine`,
the core in a process of its own) and the core (`engine_core.py`) import their messages from here
and from nowhere on the other side, as vLLM's front end and `EngineCoreProc` share
`vllm/v1/engine/__init__.py`. The messages are plain dataclasses, so either channel carries them:
an in-process queue (`LocalInbox`) or a pipe (pickled, read back whole by `Frames`).

    front -> core: a batch (list) of AddRequest | AbortRequest | Call, applied in the order sent
    core -> front: CoreFacts once after start-up (or the start-up exception), then one TurnOutput per
                   loop turn that did anything

Invariant: the core answers each `Call` once, in the turn that applied it, and counts every
AddRequest and AbortRequest it applied (`TurnOutput.applied`), so the front end always knows what
the core has not seen yet.
"""
from __future__ import annotations

import os
import pickle
import queue
import struct
from dataclasses import dataclass, field
from typing import Any

from reference_engine.config import EngineConfig, ModelConfig
from reference_engine.outputs import TokenDelta
from reference_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class AddRequest:
    """Front -> core: queue a request that the front end's `InputProcessor` has accepted."""
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str
    cache_salt: str | None = None


@dataclass(frozen=True)
class AbortRequest:
    """Front -> core: abort a request (its stream ends with finish_reason "abort")."""
    request_id: str


@dataclass(frozen=True)
class Call:
    """Front -> core: run `LLMEngine.<name>(*args)` between two steps and reply with its result
    ("stop": abort everything and exit)."""
    call_id: int
    name: str
    args: tuple = ()


@dataclass
class EngineStats:
    """The core's counters after a turn (`LLMEngine.stats`): what /metrics and the harness read."""
    num_running: int
    num_waiting: int
    kv_used_blocks: int
    kv_total_blocks: int
    kv_usage: float
    kv_capacity_tokens: int
    block_size: int
    num_preemptions_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_requests_finished: int
    prefix_cache_queries: int = 0  # tokens looked up at admission (vLLM's meaning)
    prefix_cache_hits: int = 0  # of which found cached
    kv_cached_blocks: int = 0  # blocks indexed in the prefix cache (held or free)
    spec_decode_num_drafts: int = 0  # requests x steps with draft tokens verified
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)  # index: draft position
    # tensor parallelism (rank 0's plain decode steps: distributed/group.DecodeShare); 0 without TP
    tp_decode_steps: int = 0
    tp_decode_seconds: float = 0.0
    tp_decode_allreduce_seconds: float = 0.0
    tp_decode_allreduce_bytes: int = 0
    # arrival -> first scheduled, summed over the requests scheduled so far, and their number (vLLM's queue time)
    request_queue_time_s: float = 0.0
    request_queue_count: int = 0

    @property
    def num_held(self) -> int:
        """Requests the core holds (running or waiting)."""
        return self.num_running + self.num_waiting


@dataclass(frozen=True)
class CoreFacts:
    """Core -> front, once, when the core has started: what the front end answers from without asking
    (the config as resolved, the limits its input processor checks, the settings read back)."""
    cfg: EngineConfig
    model_config: ModelConfig
    max_model_len: int
    kv_capacity_tokens: int
    stats: EngineStats
    effective: dict
    pid: int


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


class LocalInbox:
    """The core's inbox when the core is a thread: `multiprocessing.Connection`'s `poll` / `recv` /
    `send` over a queue, so one core loop serves both channels."""

    def __init__(self):
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.held: list = []

    def send(self, batch: list) -> None:
        self.q.put(batch)

    def poll(self, timeout: float | None = 0.0) -> bool:
        if not self.held:
            try:
                self.held.append(self.q.get(timeout=timeout) if timeout != 0.0 else self.q.get_nowait())
            except queue.Empty:
                return False
        return True

    def recv(self) -> list:
        return self.held.pop() if self.held else self.q.get()


class Frames:
    """Whole messages from the core's end of a pipe, read without ever blocking the event loop.
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
            frame = bytes(self.buf[head:head + n])
            del self.buf[:head + n]  # before unpickling: a frame that fails to load is not read forever
            out.append(pickle.loads(frame))
        return out, ended
