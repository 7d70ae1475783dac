"""A worker rank (> 0): build this rank's runner, then run every step rank 0 broadcasts, until told to stop.

`python -m reference_engine.distributed.worker --rank R --size N --port P --ppid PID`, started by
rank 0 (`group.start`) with the engine's config as JSON in `INFERLAB_TP_CONFIG`. The worker holds
its shard of the weights and of the KV cache (the same block ids as rank 0, its own heads), runs the
forward of each step's record and takes part in the all-reduces; it never samples (rank 0 does, from
replicated logits) and never sees a request. It exits when rank 0 sends None, when rank 0's socket
closes (gloo raises), or when its parent process is gone (`PR_SET_PDEATHSIG`, and a parent-pid
check for where that is unavailable): no orphan rank.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import threading
import time

from reference_engine.config import EngineConfig
from reference_engine.distributed import group
from reference_engine.worker.model_runner import ModelRunner


def die_with_parent(ppid: int) -> None:
    """Exit when `ppid` is no longer our parent (rank 0 killed, even by SIGKILL)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass

    def watch() -> None:
        while os.getppid() == ppid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


def serve(runner: ModelRunner, tp: group.Group) -> None:
    """The step loop: one forward per record until rank 0 sends None."""
    while True:
        msg = tp.recv_step()
        if msg is None:
            return
        runner.forward(*msg)


def run(cfg: EngineConfig, tp: group.Group) -> int:
    runner = ModelRunner(cfg, tp=tp)
    try:
        serve(runner, tp)
    except RuntimeError as e:  # rank 0 went away mid-collective: nothing to report to anyone but stderr
        print(f"tensor-parallel rank {tp.rank}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reference_engine.distributed.worker")
    for name in ("--rank", "--size", "--port", "--ppid"):
        ap.add_argument(name, type=int, required=True)
    args = ap.parse_args(argv)
    die_with_parent(args.ppid)
    cfg = EngineConfig(**json.loads(os.environ["INFERLAB_TP_CONFIG"]))
    tp = group.join(args.rank, args.size, args.port, cfg.device)
    code = run(cfg, tp)
    os._exit(code)  # skip interpreter teardown of a process group whose peer may be gone


if __name__ == "__main__":
    sys.exit(main())
