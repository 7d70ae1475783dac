"""The reaper beside each Ray task (experiments/cluster/reaper.py): an engine in a process group of its own dies
when its task's process dies, however it dies; a task that ends normally keeps its own helpers. No Ray here."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

TASK = textwrap.dedent("""
    import subprocess, sys, time
    from experiments.cluster.reaper import Reaper
    reaper = Reaper.start()
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], process_group=0)  # as the launcher
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # the task's own group
    print(engine.pid, helper.pid, reaper.proc.pid, flush=True)
    if sys.argv[1] == "close":
        time.sleep(1.5)   # the reaper notes descendants every 0.2 s
        reaper.close()
        print("closed", flush=True)
    time.sleep(600)
""")


def _start(how: str) -> tuple[subprocess.Popen, list[int]]:
    task = subprocess.Popen([sys.executable, "-c", TASK, how], stdout=subprocess.PIPE, text=True,
                            cwd=os.getcwd(), start_new_session=True)
    return task, [int(x) for x in task.stdout.readline().split()]


def _gone(pid: int) -> bool:
    """Killed: no such process, or a zombie its parent has not reaped (the task's own Popen never waits)."""
    for _ in range(300):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_an_engine_in_its_own_process_group_dies_with_its_task():
    task, (engine, helper, reaper) = _start("kill")
    try:
        assert os.getpgid(engine) == engine != os.getpgid(task.pid)
        time.sleep(1.5)  # the reaper notes descendants every 0.2 s
        task.send_signal(signal.SIGKILL)  # as Ray kills a cancelled task's worker, or a dead raylet's
        task.wait()
        assert _gone(engine) and _gone(helper) and _gone(reaper)
    finally:
        for pid in (engine, helper):
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_task_that_ends_normally_keeps_its_own_helpers_and_loses_its_engines():
    task, (engine, helper, reaper) = _start("close")
    try:
        assert task.stdout.readline().strip() == "closed"
        assert _gone(engine) and _gone(reaper)
        assert psutil.pid_exists(helper) and psutil.Process(helper).status() != psutil.STATUS_ZOMBIE
    finally:
        task.kill()
        task.wait()
        for pid in (engine, helper):
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_child_that_leaves_the_tasks_group_after_it_was_first_noted_is_noted_in_its_new_group():
    """The race behind a failed CI run (2026-12-07): the reaper looked at the task's children between an engine's fork
    and its setpgid, noted it in the task's own group and kept that, so a task that ended normally spared its engine
    as one of its own helpers. Planted: a child that moves to a group of its own when told, after it was first noted."""
    from experiments.cluster.reaper import _note

    child = subprocess.Popen([sys.executable, "-c", "import os, sys, time; sys.stdin.readline(); os.setpgid(0, 0); "
                              "time.sleep(60)"], stdin=subprocess.PIPE, text=True)
    try:
        seen: dict = {}
        _note(psutil.Process(), seen)
        assert seen[child.pid][1] == os.getpgid(0)
        child.stdin.write("go\n")
        child.stdin.flush()
        for _ in range(600):
            if os.getpgid(child.pid) == child.pid:
                break
            time.sleep(0.05)
        _note(psutil.Process(), seen)
        assert seen[child.pid][1] == child.pid
    finally:
        child.kill()
        child.wait()
