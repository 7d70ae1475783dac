"""The step log: one JSON line per engine step, appended to a file (`EngineConfig.step_log`,
`inferlab serve --step-log PATH`), for a served engine whose steps are wanted offline.

`record_steps` keeps a full `StepRecord` per step in memory (block tables included), which suits a
bounded offline run (`inferlab trace`, the simulator's sweep) but not a server that runs for hours.
The log keeps nothing: each step writes the fields a step's shape is rebuilt from
(`experiments.simulate.sweep.shapes`) and its wall time, under the `StepRecord` names, then forgets.

A line: {"pid", "t" (time.time() at the step's end), "t0" (time.monotonic() at its start), "step",
"duration_s", "scheduled": [[request id, tokens, "prefill" | "decode" | "verify"], ...], "prefix_hits", "arrived"
({request id: time.monotonic() when the core queued it} for those admitted this step: the keys of
prefix_hits), "preempted", "finished", "new_tokens", "spec_proposed", "spec_accepted", "shared_kv_tokens"}.
CLOCK_MONOTONIC is one clock for every process of a machine, so "arrived" and "t0" line up with a client's monotonic
timestamps: how long a request took to reach the core, waited there, and was prefilled. Several processes may append to one file (a harness's repeats
each start a server): the file is opened for appending, so a line lands whole at the end, and `pid`
tells the processes apart.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, fields


class StepLog:
    def __init__(self, path: str):
        self.path = path
        self.pid = os.getpid()
        try:  # line-buffered: a killed server leaves every finished step on disk
            self.f = open(path, "a", buffering=1)
        except OSError as e:
            raise ValueError(f"step_log {path!r}: cannot append to it ({e.strerror})") from None

    def write(self, step: int, t0: float, dt: float, kinds, sched, out, finished: list[str], shared_kv: int = 0) -> None:
        arrived = {r.request_id: round(r.arrival_time, 6) for r, _ in sched.scheduled if r.request_id in sched.prefix_hits}
        self.f.write(json.dumps({
            "pid": self.pid, "t": round(time.time(), 6), "t0": round(t0, 6), "step": step, "duration_s": dt,
            "scheduled": kinds, "prefix_hits": dict(sched.prefix_hits), "arrived": arrived,
            "preempted": [r.request_id for r in sched.preempted], "finished": finished,
            "new_tokens": {r.request_id: len(t) for r, t in zip(out.reqs, out.token_ids)},
            "spec_proposed": {rid: len(d) for rid, d in sched.spec_tokens.items()},
            "spec_accepted": {rid: out.num_accepted.get(rid, 0) for rid in sched.spec_tokens},
            "shared_kv_tokens": shared_kv,
        }, separators=(",", ":")) + "\n")


@dataclass
class LoggedStep:
    """One line of the log, under the `StepRecord` names that `sweep.shapes` reads."""
    pid: int
    step: int
    duration_s: float
    scheduled: list[tuple]  # (request id, tokens, ScheduledSeq.kind)
    t: float = 0.0
    t0: float = 0.0
    prefix_hits: dict = field(default_factory=dict)
    arrived: dict = field(default_factory=dict)
    preempted: list = field(default_factory=list)
    finished: list = field(default_factory=list)
    new_tokens: dict = field(default_factory=dict)
    spec_proposed: dict = field(default_factory=dict)
    spec_accepted: dict = field(default_factory=dict)
    shared_kv_tokens: int = 0  # absent from logs written before it: read as 0


NAMES = {f.name for f in fields(LoggedStep)}


def read(path: str) -> dict[int, list[LoggedStep]]:
    """The log's steps per process (pid -> steps in order). A torn last line (the process killed
    mid-write) is skipped."""
    out: dict[int, list[LoggedStep]] = {}
    with open(path) as f:
        for line in f:
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            d["scheduled"] = [tuple(x) for x in d["scheduled"]]
            out.setdefault(d["pid"], []).append(LoggedStep(**{k: v for k, v in d.items() if k in NAMES}))
    return out
