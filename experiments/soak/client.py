"""One soak request over aiohttp, returned as a record.

A record has the keys `experiments.measuring.metrics.per_request` reads (`request_id`, `send_ns`, `events` =
[[recv_ns, tokens], ...] of token-bearing chunks, `output_token_ids`, `prompt_token_ids`), so TTFT
and TPOT are computed exactly as the harness computes them, plus: `kind`, `name` (an invalid
request's), `status`, `done` (the stream reached [DONE] / the JSON body was read), `cut` (the client
closed it), `finish` {choice index: reason}, `logprob_chunks`, `text` (choice 0), `error`
("in-stream: ..." for an error event after the 200, "transport: ..." for a broken connection),
`done_ns`, and what was asked: `n`, `logprobs`. `recv_ns` is taken when a line arrives, before it is
parsed, as in adapters/transport/sse.py.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import time

import aiohttp

from experiments.soak.mix import Req

READ_BUFSIZE = 1 << 22  # a chunk may carry a long prompt's ids (adapters/transport/sse.py)
_ids = itertools.count()


def session() -> aiohttp.ClientSession:
    """No cap on connections (a capped pool would queue requests inside the client and add to TTFT);
    idle pooled connections dropped after 2 s, before a server's idle timeout could close them under us."""
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)
    return aiohttp.ClientSession(connector=conn, read_bufsize=READ_BUFSIZE,
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=600))


def _record(req: Req) -> dict:
    return {"request_id": f"{req.kind}-{next(_ids)}", "kind": req.kind, "name": req.name, "status": None,
            "send_ns": time.perf_counter_ns(), "events": [], "output_token_ids": [], "prompt_token_ids": [],
            "finish": {}, "cut": False, "done": False, "logprob_chunks": 0, "text": "", "error": None,
            "done_ns": None, "n": (req.body or {}).get("n", 1), "logprobs": bool((req.body or {}).get("logprobs"))}


def _take(rec: dict, chunk: dict, recv_ns: int) -> None:
    """Fold one streamed chunk into the record."""
    if "error" in chunk:
        rec["error"] = f"in-stream: {str(chunk['error'])[:200]}"
        return
    if chunk.get("prompt_token_ids"):
        rec["prompt_token_ids"] = chunk["prompt_token_ids"]
    got = 0
    for ch in chunk.get("choices") or []:
        ids = ch.get("token_ids") or []
        got += len(ids)
        rec["output_token_ids"] += ids
        if ch.get("index", 0) == 0:
            rec["text"] += (ch.get("delta") or {}).get("content") or ch.get("text") or ""
        if ch.get("logprobs"):
            rec["logprob_chunks"] += 1
        if ch.get("finish_reason"):
            rec["finish"][ch.get("index", 0)] = ch["finish_reason"]
    if got:
        rec["events"].append([recv_ns, got])


async def _stream(resp: aiohttp.ClientResponse, rec: dict, cut_after: int | None) -> None:
    async for raw in resp.content:
        recv_ns = time.perf_counter_ns()
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            rec["done"] = True
            return
        _take(rec, json.loads(payload), recv_ns)
        if cut_after is not None and len(rec["events"]) >= cut_after and not rec["finish"]:
            rec["cut"] = True  # closing the connection is how a client abandons a stream
            resp.close()
            return


def _whole(rec: dict, body: dict) -> None:
    """A non-streamed answer (the probes)."""
    for ch in body.get("choices") or []:
        rec["output_token_ids"] += ch.get("token_ids") or []
        rec["text"] += (ch.get("message") or {}).get("content") or ch.get("text") or ""
        rec["finish"][ch.get("index", 0)] = ch.get("finish_reason")
    first = (body.get("choices") or [{}])[0]
    rec["prompt_token_ids"] = body.get("prompt_token_ids") or first.get("prompt_token_ids") or []  # chat / completions
    rec["done"] = True


async def send(http: aiohttp.ClientSession, base: str, req: Req) -> dict:
    rec = _record(req)
    data = req.raw if req.raw is not None else json.dumps(req.body).encode()
    try:
        async with http.post(base + req.path, data=data, headers={"content-type": "application/json"}) as resp:
            rec["status"] = resp.status
            if resp.status != 200 or req.raw is not None:
                rec["body"] = (await resp.read())[:300].decode("utf-8", "replace")
            elif req.body.get("stream"):
                await _stream(resp, rec, req.cut_after)
            else:
                _whole(rec, await resp.json())
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as err:  # ValueError: a malformed chunk
        rec["error"] = f"transport: {type(err).__name__}: {err}"[:300]
    rec["done_ns"] = time.perf_counter_ns()
    return rec
