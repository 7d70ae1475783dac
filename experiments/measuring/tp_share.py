"""Distributed measurement honesty: devices, throughput per device, and the all-reduce share of a decode step.

`devices` and `output_throughput_per_device` come from the sizes the engine reported
(adapters.common.parallel.gpus: tensor x pipeline x data). The all-reduce share is measured by the engine
itself (the reference engine's rank 0 times its plain decode steps and the all-reduces inside them,
`inferlab:tp_decode_*` counters, read around each level); beside it, the estimate a reader would make
on paper: a ring all-reduce of M bytes over N ranks moves 2 (N - 1) / N x M bytes through each
rank's link, divided by the link bandwidth. On one CPU host the "link" is memory: the estimate uses
the machine's measured copy bandwidth, and ignores per-message latency, which on gloo over loopback
is most of the cost; the gap between the two numbers is the point of showing both.
"""
from __future__ import annotations

from typing import Any

from adapters.common import parallel


def summary(s: dict[str, Any], effective: dict[str, Any], counters: dict[str, Any], link_gbps: float | None) -> dict:
    per_engine, _ = parallel.gpus(effective)
    out: dict[str, Any] = {}
    if per_engine:
        out["devices"] = per_engine
        if s.get("output_throughput"):
            out["output_throughput_per_device"] = s["output_throughput"] / per_engine
    steps = counters.get("tp_decode_steps")
    if not steps or not counters.get("tp_decode_seconds"):
        return out
    step_s = counters["tp_decode_seconds"] / steps
    ar_s = counters.get("tp_decode_allreduce_seconds", 0.0) / steps
    msg = counters.get("tp_decode_allreduce_bytes", 0) / steps
    n = int(effective.get("tensor_parallel_size") or 1)
    out.update(decode_steps=steps, decode_step_ms=step_s * 1e3, allreduce_ms=ar_s * 1e3, allreduce_share=ar_s / step_s,
               allreduce_bytes=msg)
    if link_gbps and n > 1:
        est = 2 * (n - 1) / n * msg / (link_gbps * 1e9)
        out.update(estimate_ms=est * 1e3, estimate_share=est / step_s)
    return out
