"""The engine core's life under faults (`ProcessAsyncEngine`, engine_core.py): control calls that do
not block the event loop, the step watchdog on a stopped core, a core that never starts, an aborted
start, a front end that never shuts down, and fork vs spawn chosen whatever the import order.

A core is "stuck" here by SIGSTOP, and a load "hangs" on a FIFO as config.json (the child blocks in
open() until a writer comes): real processes, no stand-ins. Waits are hang detectors, never bounds."""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from reference_engine import EngineConfig, SamplingParams
from reference_engine.engine.client import StartAborted
from reference_engine.engine.engine_process import ProcessAsyncEngine
from tests.reference_engine.engine.test_engine_process import GENERATE

REPO = Path(__file__).resolve().parents[3]
LONG = SamplingParams(max_tokens=100_000 // 100, temperature=0.0, ignore_eos=True)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_a_control_call_waits_without_blocking_the_event_loop(tiny_llama):
    """memory_report while the core is stopped: the event loop keeps running (a sleep returns, the call
    is pending), and the reply comes once the core runs again. The old call read the pipe synchronously."""
    engine = await ProcessAsyncEngine(EngineConfig(str(tiny_llama), kv_cache_tokens=2048)).start()
    try:
        stream = engine.add_request([5, 6, 7], LONG)
        await stream.__anext__()
        os.kill(engine.core_pid, signal.SIGSTOP)
        call = asyncio.ensure_future(engine.memory_report())
        await asyncio.sleep(0.3)  # returns: the loop is free while the call waits
        assert not call.done() and engine.is_alive
        os.kill(engine.core_pid, signal.SIGCONT)
        assert (await call)["kv_allocated"] > 0
        assert (await stream.__anext__()).new_token_ids  # the stream flows on
    finally:
        await engine.shutdown()


async def test_the_step_watchdog_declares_a_stopped_core_dead(tiny_llama):
    deaths = []
    engine = ProcessAsyncEngine(EngineConfig(str(tiny_llama), kv_cache_tokens=2048), step_timeout=1.0,
                                on_death=deaths.append)
    await engine.start()
    try:
        assert engine.effective_config()["step_timeout_s"] == 1.0
        stream = engine.add_request([5, 6, 7], LONG)
        await stream.__anext__()
        pid = engine.core_pid
        os.kill(pid, signal.SIGSTOP)
        call = asyncio.ensure_future(engine.memory_report())
        with pytest.raises(RuntimeError, match="stuck"):  # an error, not a hang
            async for _ in stream:
                pass
        with pytest.raises(RuntimeError, match="stuck"):
            await call
        assert not engine.is_alive and len(deaths) == 1 and "watchdog" in deaths[0]
        assert gone(pid)  # killed: a stopped process holds its memory forever
    finally:
        await engine.shutdown()


async def test_an_idle_core_is_not_stuck_whatever_streams_the_front_still_holds(tiny_llama):
    """The core answered everything and holds no request; a stream the front end still holds (whose end was
    never delivered) must not make the watchdog call the idle core stuck. CI's session server sat idle past
    the limit with one such stream and was killed ("no step for 237.8 s while 1 requests were open")."""
    from reference_engine.engine.client import RequestStream

    deaths = []
    engine = ProcessAsyncEngine(EngineConfig(str(tiny_llama), kv_cache_tokens=2048), step_timeout=0.5,
                                on_death=deaths.append)
    await engine.start()
    try:
        async for _ in engine.generate([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)):
            pass
        orphan = engine._streams["orphan"] = RequestStream("orphan")  # as a lost end would leave it
        await asyncio.sleep(2.0)  # four times the limit, idle
        assert engine.is_alive and deaths == []
        async for _ in engine.generate([8, 9], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)):
            pass  # and it still serves
        # the first turn after which the core holds nothing and has applied every add ends the orphan
        with pytest.raises(RuntimeError, match="lost request 'orphan'"):
            await asyncio.wait_for(orphan.__anext__(), 60)  # a hang detector, not a time bound
        assert engine._streams == {}
    finally:
        await engine.shutdown()


def fifo_model(tmp_path: Path) -> Path:
    """A model directory whose config.json is a FIFO: the core blocks opening it, as a hung load."""
    d = tmp_path / "hangs"
    d.mkdir()
    os.mkfifo(d / "config.json")
    return d


def cores() -> list:
    return [p for p in multiprocessing.active_children() if p.name == "inferlab-engine-core"]


async def test_a_core_that_never_starts_is_killed_after_the_ready_timeout(tmp_path, monkeypatch):
    from reference_engine.engine import engine_process
    monkeypatch.setattr(engine_process, "READY_TIMEOUT_S", 1.0)
    with pytest.raises(RuntimeError, match="sent nothing within 1 s"):
        await ProcessAsyncEngine(EngineConfig(str(fifo_model(tmp_path)))).start()
    assert cores() == []


async def test_abort_start_kills_a_loading_core(tmp_path):
    engine = ProcessAsyncEngine(EngineConfig(str(fifo_model(tmp_path))))
    start = asyncio.ensure_future(engine.start())
    while not cores():  # the child exists (and blocks in its load)
        await asyncio.sleep(0.01)
    [core] = cores()
    engine.abort_start()
    with pytest.raises(StartAborted):
        await start
    assert cores() == [] and gone(core.pid) and not engine.is_alive


NO_SHUTDOWN = """
import asyncio, sys
from reference_engine import EngineConfig
from reference_engine.engine.engine_process import ProcessAsyncEngine
async def main():
    engine = await ProcessAsyncEngine(EngineConfig(sys.argv[1], kv_cache_tokens=256)).start()
    print(engine.core_pid, flush=True)  # and never shut down
asyncio.run(main())
"""

OP_BEFORE_IMPORT = """
import asyncio, sys, torch
torch.ones(512, 512) @ torch.ones(512, 512)  # two threads: OpenMP's pool exists before the engine's import
""" + GENERATE + """
print(start_method(), asyncio.run(main()))
"""


def run_child(script: str, model: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "INFERLAB_ENGINE_START"}
    env.update(OMP_NUM_THREADS="2", PYTHONPATH=str(REPO))
    # timeout: a hang detector only (the old code hung forever in both cases), not a time bound
    return subprocess.run([sys.executable, "-c", script, str(model)], env=env, capture_output=True, text=True,
                          timeout=600)


def test_an_interpreter_that_never_shuts_the_engine_down_exits_and_leaves_no_core(tiny_llama):
    p = run_child(NO_SHUTDOWN, tiny_llama)
    assert p.returncode == 0, p.stderr[-2000:]
    assert gone(int(p.stdout.split()[-1]))


def test_a_torch_op_before_the_engine_is_imported_makes_it_spawn(tiny_llama):
    """The old rule counted threads at the module's import, so a pool started earlier looked safe to
    fork, and the forked core hung in its first parallel region."""
    p = run_child(OP_BEFORE_IMPORT, tiny_llama)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[-2:] == ["spawn", "4"]


@pytest.mark.parametrize("size", [100, 60_000])  # one write, and header + body written apart
def test_half_a_message_never_blocks_the_reader(size):
    """A core stopped in the middle of a send leaves half a frame in the pipe: the front end's reader
    returns what is whole (nothing yet) instead of waiting on the event loop for the rest, as
    `Connection.recv` did (the server hung with its core stopped mid-send: experiments/soak/faults.py)."""
    import pickle
    import struct

    from reference_engine.engine.messages import Frames

    r, w = multiprocessing.Pipe(duplex=False)
    body = pickle.dumps({"deltas": "x" * size})
    frame = struct.pack("!i", len(body)) + body
    frames = Frames(r.fileno())
    os.write(w.fileno(), frame[:3])
    assert frames.read() == ([], False)
    os.write(w.fileno(), frame[3:len(frame) // 2])
    assert frames.read() == ([], False)
    os.write(w.fileno(), frame[len(frame) // 2:])
    assert frames.read() == ([{"deltas": "x" * size}], False)
    w.send({"next": 1})  # framed by Connection.send itself
    assert frames.read() == ([{"next": 1}], False)
    w.close()
    assert frames.read() == ([], True)
