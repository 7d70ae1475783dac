"""The tensor-parallel process group: starting the ranks, the per-step broadcast, the all-reduce.

Rank 0 is the engine's own process (scheduler, runner, sampler); `start` launches one worker
process per extra rank (`python -m reference_engine.distributed.worker`, as vLLM's multiprocessing
executor starts its workers), or, under `torchrun`, finds its rank in the environment and launches
nothing. The groups are made over the engine's own store, not as torch's global default group, so
that several TP engines may live in one process (tests; one engine after another):

- the CPU group (gloo) carries each step's plain record from rank 0 to the workers (pickled, as
  `broadcast_object_list` does); its timeout is long, since a worker waits there while the engine
  is idle;
- the device group (the same gloo group on CPU, nccl on CUDA) carries the row-parallel layers'
  all-reduces, each with a short timeout (`COLLECTIVE_TIMEOUT`): a rank that stops answering
  mid-forward is an error, not a hang.

Failure: gloo raises at once when a peer's socket closes (a killed rank), and `Group` turns that
into `RankFailure` naming the rank and its exit code. A watchdog thread on rank 0 polls the worker
processes; when one exits unexpectedly it kills the others (no orphan rank) and marks the group
failed, so an idle engine knows too (`failure`). Workers die with rank 0: `PR_SET_PDEATHSIG` and a
parent-pid check in the worker (`worker.py`).
"""
from __future__ import annotations

import atexit
import dataclasses
import datetime
import json
import os
import pickle
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)  # one all-reduce, or one rank's share of a forward
IDLE_TIMEOUT = datetime.timedelta(days=30)  # a worker waiting for the next step
JOIN_TIMEOUT_S = 120.0  # workers connecting at start (they import torch first)


class RankFailure(RuntimeError):
    """A tensor-parallel rank died or stopped answering; the engine cannot step any more."""


@dataclasses.dataclass
class AllReduceStats:
    """Time and bytes of the all-reduces since the last `reset` (rank 0's view; CPU timings are exact
    since gloo's all-reduce is synchronous, CUDA's include a device sync)."""
    calls: int = 0
    seconds: float = 0.0
    bytes: int = 0

    def reset(self) -> None:
        self.calls, self.seconds, self.bytes = 0, 0.0, 0


@dataclasses.dataclass
class DecodeShare:
    """Rank 0's plain decode steps (every sequence one query token): their count, wall time, and the
    time and bytes of the all-reduces inside them. The all-reduce share of a decode step is
    `allreduce_seconds / seconds`; the report sets it beside bytes / link bandwidth."""
    steps: int = 0
    seconds: float = 0.0
    allreduce_seconds: float = 0.0
    allreduce_bytes: int = 0

    def add(self, seconds: float, allreduce_seconds: float, allreduce_bytes: int) -> None:
        self.steps += 1
        self.seconds += seconds
        self.allreduce_seconds += allreduce_seconds
        self.allreduce_bytes += allreduce_bytes


class AllReduce:
    """The row-parallel layers' sum over ranks, timed. Called with each layer's partial output."""

    def __init__(self, group, cuda: bool):
        self.group, self.cuda = group, cuda
        self.stats = AllReduceStats()
        self.log: list[dict] | None = None  # a list: each call is appended (per-step records, the trace)

    def __call__(self, y: torch.Tensor, layer: str = "") -> None:
        t0 = time.perf_counter()
        self.group.allreduce(y, dist.ReduceOp.SUM, timeout=COLLECTIVE_TIMEOUT).wait()
        if self.cuda:
            torch.cuda.synchronize(y.device)
        dt, n = time.perf_counter() - t0, y.numel() * y.element_size()
        self.stats.calls += 1
        self.stats.seconds += dt
        self.stats.bytes += n
        if self.log is not None:
            self.log.append({"layer": layer, "shape": list(y.shape), "bytes": n, "ms": round(dt * 1e3, 3)})


class Group:
    """This process's rank in the tensor-parallel group; on rank 0 also the workers it started."""

    def __init__(self, store, rank: int, size: int, device: torch.device, procs: list[subprocess.Popen] | None = None):
        self.rank, self.size, self.device = rank, size, device
        self.procs = procs or []
        self.failure: str | None = None
        cuda = device.type == "cuda"
        self.store = store  # the groups keep using it (nccl's id exchange, gloo's rendezvous)
        self.cpu_group = dist.ProcessGroupGloo(dist.PrefixStore("cpu/", store), rank, size, IDLE_TIMEOUT)
        if cuda:
            torch.cuda.set_device(device)
            self.device_group = dist.ProcessGroupNCCL(dist.PrefixStore("dev/", store), rank, size)
        else:
            self.device_group = self.cpu_group
        self.all_reduce = AllReduce(self.device_group, cuda)
        self.decode = DecodeShare()
        self._closed = False
        if self.procs:
            atexit.register(self.close)
            threading.Thread(target=self._watch, name="tp-watchdog", daemon=True).start()

    # ---- steps ------------------------------------------------------------------------
    def send_step(self, msg) -> None:
        """Rank 0: hand this step's record (or None: stop) to every worker."""
        self.check()
        data = torch.frombuffer(bytearray(pickle.dumps(msg)), dtype=torch.uint8)
        self._collective(lambda: (self._bcast(torch.tensor([data.numel()])), self._bcast(data)))

    def recv_step(self):
        """Worker: the next step's record from rank 0 (None: stop)."""
        n = torch.zeros(1, dtype=torch.int64)
        self._bcast(n)
        data = torch.empty(int(n.item()), dtype=torch.uint8)
        self._bcast(data)
        return pickle.loads(data.numpy().tobytes())

    def _bcast(self, t: torch.Tensor) -> None:
        self.cpu_group.broadcast(t, 0).wait()

    def _reduce(self, t: torch.Tensor, op) -> torch.Tensor:
        self._collective(lambda: self.cpu_group.allreduce(t, op, timeout=COLLECTIVE_TIMEOUT).wait())
        return t

    def min(self, n: int) -> int:
        """The smallest of every rank's `n` (KV blocks: every rank must hold the same number)."""
        return int(self._reduce(torch.tensor([n], dtype=torch.int64), dist.ReduceOp.MIN).item())

    def gather(self, n: int) -> list[int]:
        """Every rank's `n`, in rank order (per-rank weight bytes for the memory report)."""
        t = torch.zeros(self.size, dtype=torch.int64)
        t[self.rank] = n
        return self._reduce(t, dist.ReduceOp.SUM).tolist()

    def wrap(self, fn):
        """Run `fn` (a forward with all-reduces); a dead peer becomes `RankFailure`."""
        return self._collective(fn)

    # ---- failure and shutdown -----------------------------------------------------------
    def check(self) -> None:
        if self.failure:
            raise RankFailure(self.failure)

    def _collective(self, fn):
        try:
            return fn()
        except RuntimeError as e:
            if isinstance(e, RankFailure):
                raise
            time.sleep(0.2)  # let the watchdog see which process exited
            self.failure = self.failure or self._who() or f"a tensor-parallel rank failed: {str(e).splitlines()[0]}"
            self.kill()
            raise RankFailure(self.failure) from e

    def _who(self) -> str | None:
        for r, p in enumerate(self.procs, start=1):
            code = p.poll()
            if code is not None:
                return f"tensor-parallel rank {r} (pid {p.pid}) exited with code {code}; the engine cannot continue"
        return None

    def _watch(self) -> None:
        while not self._closed:
            who = self._who()
            if who and not self._closed:
                self.failure = who
                self.kill()
                return
            time.sleep(0.2)

    def kill(self) -> None:
        """End every worker now (SIGKILL after a short SIGTERM grace)."""
        self._closed = True
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 3
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def close(self, graceful: bool = True) -> None:
        """Rank 0: tell the workers to stop (`graceful`: only between steps), wait for them briefly, then
        make sure they are gone."""
        if graceful and not self._closed and not self.failure:
            try:
                self.send_step(None)
            except RankFailure:
                pass
        self._closed = True
        atexit.unregister(self.close)  # the registration alone would keep a closed group (and its store) alive
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    @property
    def pids(self) -> list[int]:
        return [os.getpid()] + [p.pid for p in self.procs]


def torchrun_rank() -> tuple[int, int] | None:
    """(rank, world size) when this process was started by torchrun, else None."""
    if "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def device_of(device: str, rank: int) -> torch.device:
    """Rank r's device: the same CPU, or cuda:r (cuda:LOCAL_RANK under torchrun)."""
    d = torch.device(device)
    if d.type != "cuda":
        return d
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))


def start(cfg) -> Group:
    """Rank 0: start the workers (or join torchrun's group) and return the group once all have joined."""
    size = cfg.tensor_parallel_size
    env = torchrun_rank()
    if env is not None:
        rank, world = env
        if world != size:
            raise ValueError(f"torchrun started {world} ranks but tensor_parallel_size is {size}")
        return join_torchrun(rank, size, cfg.device)
    store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
    config = json.dumps(dataclasses.asdict(cfg))
    procs = [subprocess.Popen([sys.executable, "-m", "reference_engine.distributed.worker", "--rank", str(r),
                               "--size", str(size), "--port", str(store.port), "--ppid", str(os.getpid())],
                              env={**os.environ, "INFERLAB_TP_CONFIG": config}) for r in range(1, size)]
    try:
        _wait_joined(store, procs)
        return Group(store, 0, size, device_of(cfg.device, 0), procs)
    except BaseException:
        for p in procs:
            p.kill()
            p.wait()
        raise


def join(rank: int, size: int, port: int, device: str) -> Group:
    """Worker: connect to rank 0's store and join the group."""
    store = dist.TCPStore("127.0.0.1", port, size, is_master=False,
                          timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
    store.set(f"joined/{rank}", "1")
    return Group(store, rank, size, device_of(device, rank))


def join_torchrun(rank: int, size: int, device: str) -> Group:
    """Any rank under torchrun: the store at MASTER_ADDR:MASTER_PORT, hosted by rank 0."""
    host = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"  # else torchrun's agent hosts it
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, is_master=host,
                          timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S))
    return Group(store, rank, size, device_of(device, rank))


def _wait_joined(store, procs: list[subprocess.Popen]) -> None:
    """Until every worker has connected; a worker that exits first (bad config, import error) fails
    the start at once, naming its exit code, instead of waiting out the store's timeout."""
    keys = [f"joined/{r}" for r in range(1, len(procs) + 1)]
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not store.check(keys):
        for r, p in enumerate(procs, start=1):
            if p.poll() is not None:
                raise RankFailure(f"tensor-parallel rank {r} exited with code {p.returncode} while starting")
        if time.monotonic() > deadline:
            raise RankFailure(f"tensor-parallel workers did not connect within {JOIN_TIMEOUT_S:.0f} s")
        time.sleep(0.05)
