"""Where a request's time before its first token went, on the client's side of the wire.

The client's TTFT counts from `send_ns`, the moment the load generator hands the request to
the adapter; an engine's own TTFT histogram counts from a clock it starts once its front end
has taken the request in. Under a burst (rate = inf: 128 requests at once on 2 cores) the two
drift apart by 100-200 ms, and the report must say on which side the time went. HTTP adapters
stamp two more moments per request (adapters/transport/sse.py `Stream.wire`):

- `write_ms` = send -> the request's last byte handed to the socket: the client's own queue
  (its event loop serialising and writing every request of the burst). Time here is the
  harness's, not the engine's.
- `front_ms` = last byte out -> the response's headers back. vLLM stamps `arrival_time` when it
  renders the prompt and our server when the route has parsed the request, both before the
  response starts, so the server's clock starts inside this span: it bounds the wait in the
  server's front end (accept, parse, validate) that the server's histograms leave out.
"""
from __future__ import annotations

from typing import Any

from experiments.measuring.metrics import NS_PER_MS, stats


def split(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Mean/median/p90/p99 of `write_ms` and `front_ms` over the records that have them."""
    write = [(r["sent_ns"] - r["send_ns"]) / NS_PER_MS for r in records if r.get("sent_ns")]
    if not write:
        return None
    front = [(r["headers_ns"] - r["sent_ns"]) / NS_PER_MS for r in records if r.get("sent_ns") and r.get("headers_ns")]
    return {"requests": len(write), "write_ms": stats(write), "front_ms": stats(front) if front else None}


GENERIC = ("likely causes: something delayed the client's reading of the streams — a /metrics scrape during "
           "the level stalling the server's front end (a timeline was on?), another process or the harness "
           "itself competing for the cores (see the harness CPU share), or work on the client's event loop")


def cause(cmp: dict[str, Any] | None, wire: dict[str, Any] | None) -> str:
    """Why the client's TTFT mean exceeds the server's, in words, from the level's split where
    the adapter stamped one: a side is named when it holds a third or more of the gap (the
    client's write of it; the server's front end of the rest, its clock starting inside that
    span), both when both do; else the generic list of suspects."""
    ttft = ((cmp or {}).get("rows") or {}).get("ttft") or {}
    gap = ttft.get("diff_ms")
    if not wire or gap is None or gap <= 0:
        return GENERIC
    w = wire["write_ms"]["mean"]
    f = (wire.get("front_ms") or {}).get("mean")
    client = w >= gap / 3
    server = f is not None and f >= (gap - w) / 3
    said = f"of the {gap:.1f} ms, {w:.1f} ms passed before the request's last byte left the client"
    harness = ("the harness's own send queue, not the engine's (a burst is written request by request; "
               "`vllm bench serve` counts its TTFT from before the write too)")
    front = (f"its response headers came back {f:.1f} ms after that: the requests waited in the server's "
             "front end (accept, parse, validate), where its clock starts, a wait its users see and its own "
             "histograms leave out")
    if client and server:
        return f"both sides: {said}, {harness}; and {front}"
    if client:
        return f"{said}: {harness}" + (f"; the response headers came {f:.1f} ms after that" if f is not None else "")
    if server:
        return f"{said}, and {front}"
    return (f"{said}" + (f" and its headers came back {f:.1f} ms later" if f is not None else "")
            + "; the rest passed after the server's clock started, " + GENERIC)
