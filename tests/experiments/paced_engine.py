"""A test fixture engine that emits tokens at known `perf_counter_ns` times.

Not a stand-in for a real engine: it exists to calibrate the harness (the truth of every
event time is known) and to be a real child process (paced_child.py) that tests can kill
mid-run. Event k of a request is due at start + ttft + k * period and carries
`pattern[k % len(pattern)]` tokens (the last event is cut to max_tokens). The child stamps
each event with the perf_counter_ns at which it wrote it (CLOCK_MONOTONIC: the same clock
in both processes); `truth[request_id]` keeps (emitted_ns, n_tokens, due_ns) per event.
Token ids are a pure function of (prompt, position), so outputs are reproducible.

Options: ttft_ms (20), period_ms (2 = 500 events/s), pattern ([1]), kv_cache_tokens
(accepted, reported as capacity), unavailable (a message: start() raises EngineUnavailable),
truth_path (where stop() writes `truth` as JSON), capacity (requests served at once; the rest
queue first come first served: a planted saturation rate of capacity / service time),
effective / memory (reported as EngineInfo.effective / .memory, to plant settings differences).
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator

from adapters.base import (Engine, EngineInfo, EngineUnavailable, GenerationRequest, MemorySnapshot, TokenEvent,
                           check_options)

CHILD = Path(__file__).with_name("paced_child.py")


def schedule(start_ns: int, max_tokens: int, ttft_ms: float, period_ms: float, pattern: list[int]) -> list[tuple[int, int]]:
    """[(due_ns, n_tokens)] of one request."""
    out, sent, k = [], 0, 0
    while sent < max_tokens:
        n = min(pattern[k % len(pattern)], max_tokens - sent)
        out.append((start_ns + int((ttft_ms + k * period_ms) * 1e6), n))
        sent, k = sent + n, k + 1
    return out


def timing(options: dict[str, Any]) -> tuple[float, float, list[int]]:
    """(ttft_ms, period_ms, pattern) from an engine's options, with the defaults above."""
    return float(options.get("ttft_ms", 20)), float(options.get("period_ms", 2)), list(options.get("pattern", [1]))


def token_ids(prompt: list[int], start: int, n: int) -> list[int]:
    return [(sum(prompt) + 7 * (start + i)) % 97 + 3 for i in range(n)]


class PacedEngine(Engine):
    name = "paced"
    OPTIONS = {"ttft_ms", "period_ms", "pattern", "kv_cache_tokens", "log_path", "unavailable", "truth_path",
               "capacity", "effective", "memory"}

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        check_options(self.name, self.options, self.OPTIONS)
        self.ttft_ms, self.period_ms, self.pattern = timing(self.options)
        self.truth: dict[str, list[tuple[int, int]]] = {}
        self.proc: asyncio.subprocess.Process | None = None
        self.queues: dict[str, asyncio.Queue] = {}
        self.reader: asyncio.Task | None = None

    async def start(self) -> EngineInfo:
        if self.options.get("unavailable"):  # plays an adapter whose engine package is missing
            raise EngineUnavailable(self.options["unavailable"])
        self.proc = await asyncio.create_subprocess_exec(sys.executable, str(CHILD), stdin=asyncio.subprocess.PIPE,
                                                         stdout=asyncio.subprocess.PIPE)
        assert json.loads(await self.proc.stdout.readline()) == {"ready": True}
        self.reader = asyncio.create_task(self._read())
        return EngineInfo("paced", "1", os.path.basename(self.model), self.dtype,
                          kv_capacity_tokens=self.options.get("kv_cache_tokens"), block_size=16, knobs=self.options,
                          mode="server", pid=self.proc.pid, effective=dict(self.options.get("effective") or {}),
                          memory=dict(self.options.get("memory") or {}))

    async def _read(self) -> None:
        assert self.proc and self.proc.stdout
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            q = self.queues.get(msg["id"])
            if q is not None:
                q.put_nowait(msg)
        code = await self.proc.wait()
        for q in self.queues.values():
            q.put_nowait({"error": f"engine process exited with code {code}"})

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        return self._child(request)

    async def _child(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        assert self.proc and self.proc.stdin
        rid = request.request_id
        q: asyncio.Queue = asyncio.Queue()
        self.queues[rid] = q
        if self.proc.returncode is not None:
            raise RuntimeError(f"engine process exited with code {self.proc.returncode}")
        self.proc.stdin.write((json.dumps({"id": rid, "prompt": request.prompt_token_ids,
                                           "max_tokens": request.sampling.max_tokens, "ttft_ms": self.ttft_ms,
                                           "period_ms": self.period_ms, "pattern": self.pattern,
                                           "capacity": self.options.get("capacity")}) + "\n").encode())
        try:
            while True:
                msg = await q.get()
                recv = time.perf_counter_ns()
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                self.truth.setdefault(rid, []).append((msg["t"], len(msg["ids"]), msg["due"]))
                yield TokenEvent(rid, msg["ids"], "", recv, msg["fin"], "length" if msg["fin"] else None,
                                 len(request.prompt_token_ids) if msg["fin"] else None)
                if msg["fin"]:
                    return
        finally:
            self.queues.pop(rid, None)

    async def abort(self, request_id: str) -> None:
        pass

    async def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(time.perf_counter_ns(), kv_capacity_tokens=self.options.get("kv_cache_tokens"),
                              num_running=len(self.queues) or None)

    async def stop(self) -> None:
        if self.options.get("truth_path"):  # for tests that run the engine through `inferlab run`
            Path(self.options["truth_path"]).write_text(json.dumps(self.truth))
        if self.proc and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self.reader:
            await self.reader
