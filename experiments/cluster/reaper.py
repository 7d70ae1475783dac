"""No engine outlives its task: a watcher process beside each Ray task (`python -m experiments.cluster.reaper PID`).

Engines run in process groups of their own (adapters/transport/launcher.py), so neither Ray killing a task's
worker (a cancelled task, Ctrl-C on the driver) nor a dying raylet reaches them. The reaper, in a session of its
own, notes every descendant of the task's process (pid, start time, process group) every `PERIOD_S`; its stdin
is a pipe from the task, so it reads end-of-file the moment the task's process ends, however it ends (its
normal return, SIGKILL, its node's raylet gone). It then kills what it noted that still runs: each process
group other than the task's own whole (SIGKILL), and, when the task's process is gone, each process of the task's
own group by pid (start time checked, so a reused pid is never hit). Where the node itself dies, its engines die
with it.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from typing import IO

import psutil

PERIOD_S = 0.2
EXIT_S = 0.5  # how long a task whose pipe closed may take to be seen dead


class Reaper:
    """The task's side: `Reaper.start()` launches the watcher; `close()` (end of the task) lets it sweep and exit."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    @classmethod
    def start(cls) -> "Reaper":
        proc = subprocess.Popen([sys.executable, "-m", "experiments.cluster.reaper", str(os.getpid())],
                                stdin=subprocess.PIPE, start_new_session=True)
        return cls(proc)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass


def _note(task: psutil.Process, seen: dict[int, tuple[float, int]]) -> None:
    try:
        kids = task.children(recursive=True)
    except psutil.Error:
        return
    for k in kids:
        if k.pid == os.getpid():
            continue
        try:  # the latest look wins: a child noted between its fork and its setpgid (Popen's process_group) was
            # still in the task's group, and kept so it would have been spared as the task's own helper
            seen[k.pid] = (k.create_time(), os.getpgid(k.pid))
        except (psutil.Error, OSError):
            continue


def sweep(seen: dict[int, tuple[float, int]], own_group: int, own_too: bool) -> list[int]:
    """Kill what was noted and still runs: the process groups not the task's own, and with `own_too` (the task's
    process is gone) each noted process of its own group too. Returns the pids it signalled."""
    hit: list[int] = []
    for group in {g for _, g in seen.values()} - {own_group, os.getpgid(0)}:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            continue
    for pid, (created, group) in seen.items():
        if group == own_group and not own_too:
            continue  # the task lives on (a Ray worker is reused): its own helpers, e.g. multiprocessing's, stay
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01:
                p.kill()
                hit.append(pid)
        except psutil.Error:
            continue
    return hit


def watch(task_pid: int, stdin: IO[bytes]) -> None:
    seen: dict[int, tuple[float, int]] = {}
    try:
        task = psutil.Process(task_pid)
        own_group = os.getpgid(task_pid)
    except (psutil.Error, OSError):
        return
    while True:
        _note(task, seen)
        ready, _, _ = select.select([stdin], [], [], PERIOD_S)
        if ready and not os.read(stdin.fileno(), 4096):  # end of file: the task's process is gone or done
            break
    _note(task, seen)  # a task that closed the pipe itself still runs: what it started since the last look counts
    sweep(seen, own_group, own_too=not _alive(task, EXIT_S))


def _alive(p: psutil.Process, within_s: float) -> bool:
    """Still running `within_s` after its pipe closed: a killed process closes its files before the kernel marks
    it a zombie (or its parent reaps it), so a dead task may look alive for a moment; a task that closed the pipe
    itself (`Reaper.close`) goes on running."""
    for _ in range(max(1, int(within_s / 0.05))):
        try:
            if not p.is_running() or p.status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            return False
        select.select([], [], [], 0.05)
    return True


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C sent to the node's terminal is the task's, not ours
    watch(int(sys.argv[1]), sys.stdin.buffer)
