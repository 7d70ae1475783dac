"""Run an in-process adapter in a process of its own, so it never shares the harness's
interpreter lock (issue point 11: latency comparisons keep the client out of the engine).

`Isolated` is an Engine that starts `python -m experiments.running.isolate MODULE:CLASS ...`, a
child that runs the real adapter on its own event loop, and talks to it over the child's
stdin/stdout in JSON lines. Events are stamped (`recv_ns`) when the harness reads them,
as for any server. The child's own stdout is redirected to stderr so library prints
cannot corrupt the protocol. Invariants: a child that dies fails every open stream with
its exit code; `stop()` leaves no child behind.
"""
from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import os
import sys
import threading
import time
from dataclasses import asdict
from typing import Any, AsyncIterator

from adapters.base import (Engine, EngineInfo, EngineUnavailable, GenerationRequest, MemorySnapshot, SamplingConfig,
                           TokenEvent)

LIMIT = 1 << 24  # longest protocol line (a long prompt's ids)


class Isolated(Engine):
    def __init__(self, target: str, model: str, dtype: str, options: dict[str, Any]):
        super().__init__(model, dtype, options)
        self.target = target
        self.name = target.rsplit(":", 1)[-1]
        self.proc: asyncio.subprocess.Process | None = None
        self.streams: dict[str, asyncio.Queue] = {}
        self.replies: dict[int, asyncio.Future] = {}
        self.keys = itertools.count()
        self.reader: asyncio.Task | None = None

    async def start(self) -> EngineInfo:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "experiments.running.isolate", self.target, self.model, self.dtype, json.dumps(self.options),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=LIMIT)
        self.reader = asyncio.create_task(self._read())
        r = await self._call("start")
        if "unavailable" in r:
            raise EngineUnavailable(r["unavailable"])
        info = EngineInfo(**r["info"])
        info.mode, info.pid = "own_process", self.proc.pid
        return info

    async def _read(self) -> None:
        assert self.proc and self.proc.stdout
        while line := await self.proc.stdout.readline():
            recv = time.perf_counter_ns()
            m = json.loads(line)
            if "ev" in m:
                q = self.streams.get(m["ev"]["request_id"])
                if q is not None:
                    q.put_nowait((recv, m["ev"]))
            elif "k" in m and m["k"] in self.replies:
                self.replies.pop(m["k"]).set_result(m)
        code = await self.proc.wait()
        err = RuntimeError(f"isolated engine process exited with code {code}")
        for q in self.streams.values():
            q.put_nowait((0, err))
        for f in self.replies.values():
            f.set_exception(err)
        self.replies.clear()

    def _send(self, msg: dict[str, Any]) -> None:
        if self.proc is None or self.proc.returncode is not None:
            raise RuntimeError("isolated engine process is not running")
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())

    async def _call(self, op: str, **kw: Any) -> dict[str, Any]:
        k = next(self.keys)
        self.replies[k] = asyncio.get_running_loop().create_future()
        self._send({"op": op, "k": k, **kw})
        r = await self.replies[k] if k in self.replies else {}
        if "error" in r:
            raise RuntimeError(r["error"])
        return r

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        q: asyncio.Queue = asyncio.Queue()
        self.streams[request.request_id] = q
        try:
            self._send({"op": "gen", "req": asdict(request)})
            while True:
                recv, ev = await q.get()
                if isinstance(ev, Exception):
                    raise ev
                if "error" in ev:
                    raise RuntimeError(ev["error"])
                ev["recv_ns"] = recv
                yield TokenEvent(**ev)
                if ev["finished"]:
                    return
        finally:
            self.streams.pop(request.request_id, None)

    async def abort(self, request_id: str) -> None:
        await self._call("abort", id=request_id)

    async def reset_prefix_cache(self) -> bool:
        return bool((await self._call("reset"))["value"])

    async def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(**(await self._call("snapshot"))["value"])

    async def memory(self) -> dict[str, int]:
        return dict((await self._call("memory"))["value"])

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.returncode is None:
            try:
                await asyncio.wait_for(self._call("stop"), timeout=60)
            except Exception:  # a wedged or dead child: kill it below
                pass
            if self.proc.returncode is None:
                self.proc.kill()
        await self.proc.wait()
        if self.reader:
            await self.reader


async def _child(target: str, model: str, dtype: str, options: dict[str, Any], out: Any) -> None:
    module, cls = target.split(":")
    options = {k: v for k, v in options.items() if k != "mode"}  # the mode picked `target` (registry.create)
    engine: Engine = getattr(importlib.import_module(module), cls)(model, dtype, options)
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()
    done = asyncio.Event()

    def write(m: dict[str, Any]) -> None:
        out.write(json.dumps(m, default=str) + "\n")
        out.flush()

    def read_stdin() -> None:  # a thread: stdin lines into the loop
        for line in sys.stdin:
            loop.call_soon_threadsafe(inbox.put_nowait, json.loads(line))
        loop.call_soon_threadsafe(inbox.put_nowait, {"op": "stop", "k": -1})

    async def gen(req: dict[str, Any]) -> None:
        req["sampling"] = SamplingConfig(**req["sampling"])
        try:
            async for ev in engine.generate(GenerationRequest(**req)):
                d = asdict(ev)
                d.pop("recv_ns")
                write({"ev": d})
        except Exception as e:  # the request failed inside the engine: the harness sees why
            write({"ev": {"request_id": req["request_id"], "error": f"{type(e).__name__}: {e}"}})

    async def reply(m: dict[str, Any], coro: Any) -> None:
        try:
            write({"k": m["k"], "value": await coro})
        except Exception as e:
            write({"k": m["k"], "error": f"{type(e).__name__}: {e}"})

    threading.Thread(target=read_stdin, daemon=True).start()
    tasks: set[asyncio.Task] = set()
    while not done.is_set():
        m = await inbox.get()
        op = m["op"]
        if op == "start":
            try:
                write({"k": m["k"], "info": (await engine.start()).to_dict()})
            except EngineUnavailable as e:
                write({"k": m["k"], "unavailable": str(e)})
            except Exception as e:  # reported to the harness as the start failure
                write({"k": m["k"], "error": f"{type(e).__name__}: {e}"})
        elif op == "gen":
            t = asyncio.create_task(gen(m["req"]))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        elif op == "abort":
            await reply(m, engine.abort(m["id"]))
        elif op == "reset":
            await reply(m, engine.reset_prefix_cache())
        elif op == "snapshot":
            await reply(m, _snap(engine))
        elif op == "memory":
            await reply(m, engine.memory())
        elif op == "stop":
            await engine.stop()
            write({"k": m["k"], "value": None})
            done.set()


async def _snap(engine: Engine) -> dict[str, Any]:
    return asdict(await engine.snapshot())


def main() -> None:
    target, model, dtype, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # library prints go to stderr, never into the protocol
    sys.stdout = sys.stderr
    asyncio.run(_child(target, model, dtype, options, out))


if __name__ == "__main__":
    main()
