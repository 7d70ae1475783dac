"""The engine's own signs that a level was past what it can hold at once, over that level only.

- Preemptions: its counter's increase (vLLM's `num_preemptions_total`, SGLang's retracted requests,
  the reference engine's, from Prometheus or, in-process, from the adapter's snapshots around the level).
- Queueing: the time its requests spent waiting to be scheduled (its queue-time histogram's sum, or the
  in-process snapshots' summed wait), as a share of their whole time in the engine (its E2E histogram's
  sum, else the client's E2E over the same requests). In a closed loop that the engine keeps up with,
  every request is scheduled within a step of arriving and the share stays near 0; past its batch limit
  (max_num_seqs) or its KV pool, requests wait for others to finish and the share grows.
None where the engine exports no such counter (it is then not a stop signal, and the report says which).
"""
from __future__ import annotations

from typing import Any


def _extra_delta(obs: dict[str, Any], name: str) -> float | None:
    before = (obs.get("snapshot_before") or {}).get("extra") or {}
    after = (obs.get("snapshot_after") or {}).get("extra") or {}
    if name in before and name in after:
        return after[name] - before[name]
    return None


def pressure(view: dict[str, Any] | None, obs: dict[str, Any], client: dict[str, Any]) -> dict[str, Any]:
    """{"preemptions": n | None, "queue_share": 0..1 | None} for one level. `view` is the level's server view
    (histogram and counter deltas), `obs` its observer record (snapshots before and after), `client` the
    client's summary of the same requests (metrics.summarize)."""
    view = view or {}
    hists, counters = view.get("histograms") or {}, view.get("counters") or {}
    preempt = counters.get("preemptions")
    if preempt is None:
        preempt = _extra_delta(obs, "num_preemptions_total")
    queue = (hists.get("queue") or {}).get("sum_s")
    if queue is None:
        queue = _extra_delta(obs, "request_queue_time_s")
    e2e = (hists.get("e2e") or {}).get("sum_s")
    if not e2e:
        mean, n = (client.get("e2el_ms") or {}).get("mean"), client.get("num_requests") or 0
        e2e = mean * n / 1e3 if mean is not None else None
    share = queue / e2e if queue is not None and e2e else None
    return {"preemptions": preempt, "queue_share": share}
