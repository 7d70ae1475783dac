"""The paced engine as a process of its own (see paced_engine.py): JSON lines in on stdin
({id, prompt, max_tokens, ttft_ms, period_ms, pattern, capacity}), JSON lines out on stdout
({id, ids, fin, due, t = the perf_counter_ns when written}) at the scheduled times. A thread per
request (or `capacity` worker threads and a FIFO queue, when set); one lock per write."""
from __future__ import annotations

import json
import queue
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for adapters.base
from paced_engine import schedule, token_ids  # noqa: E402

lock = threading.Lock()


def serve(req: dict) -> None:
    pos = 0
    sched = schedule(time.perf_counter_ns(), req["max_tokens"], req["ttft_ms"], req["period_ms"], req["pattern"])
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


def worker(q: queue.Queue) -> None:
    while True:
        serve(q.get())


print(json.dumps({"ready": True}), flush=True)  # the parent's start() waits for this
waiting: queue.Queue | None = None
for raw in sys.stdin:
    req = json.loads(raw)
    if req.get("capacity"):  # a planted saturation: `capacity` requests served at a time, the rest queue (FIFO)
        if waiting is None:
            waiting = queue.Queue()
            for _ in range(req["capacity"]):
                threading.Thread(target=worker, args=(waiting,), daemon=True).start()
        waiting.put(req)
    else:
        threading.Thread(target=serve, args=(req,), daemon=True).start()
