"""The paced engine as a process of its own (see paced_engine.py): JSON lines in on stdin
({id, prompt, max_tokens, ttft_ms, period_ms, pattern, capacity}), JSON lines out on stdout
({id, ids, fin, due, t = the perf_counter_ns when written}) at the scheduled times. A thread per
request; one lock per write.

With `capacity` set, the child is a FIFO queue with that many servers, kept in scheduled time:
a request starts at max(its arrival, the earliest server's scheduled finish) and its events are
due from there. A late wake-up (a loaded 2-core machine delays sleeps by milliseconds) delays
that event only; it never pushes back the requests behind it, so the planted saturation rate
is exactly capacity / (ttft + (events - 1) * period), however busy the machine is."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for adapters.base
from paced_engine import schedule, token_ids  # noqa: E402

lock = threading.Lock()


def serve(req: dict, start_ns: int) -> None:
    pos = 0
    sched = schedule(start_ns, req["max_tokens"], req["ttft_ms"], req["period_ms"], req["pattern"])
    for i, (due, n) in enumerate(sched):
        ids, fin = token_ids(req["prompt"], pos, n), i == len(sched) - 1
        delay = (due - time.perf_counter_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)
        with lock:
            line = json.dumps({"id": req["id"], "ids": ids, "fin": fin, "due": due, "t": time.perf_counter_ns()})
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        pos += n


def admit(free_at: list[int], req: dict, arrival_ns: int) -> int:
    """Scheduled start of `req` on the server that frees first; books that server until the
    request's last event is due. `free_at` holds each server's scheduled finish (ns)."""
    i = min(range(len(free_at)), key=free_at.__getitem__)
    start = max(arrival_ns, free_at[i])
    free_at[i] = schedule(start, req["max_tokens"], req["ttft_ms"], req["period_ms"], req["pattern"])[-1][0]
    return start


print(json.dumps({"ready": True}), flush=True)  # the parent's start() waits for this
free_at: list[int] | None = None
for raw in sys.stdin:
    req, now = json.loads(raw), time.perf_counter_ns()
    start = now
    if req.get("capacity"):  # a planted saturation: `capacity` requests served at a time, the rest queue (FIFO)
        free_at = free_at or [0] * req["capacity"]
        start = admit(free_at, req, now)
    threading.Thread(target=serve, args=(req, start), daemon=True).start()
