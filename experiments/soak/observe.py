"""What the soak samples every `period_s`: the server tree's RSS (psutil: the server process and its
children, the engine core among them; pages they share count once per process, a constant that
leaves the slope alone), the server's gauges from /metrics, and the latency of the
interactive requests that finished since the last sample.

KV blocks in use = `vllm:kv_cache_usage_perc` x `num_gpu_blocks` (the label of
`vllm:cache_config_info`). The engine counts a block as used while a request holds it; a block
that only the prefix cache remembers is free (it is in the pool's free queue and the first to be
evicted), so an idle server reads 0 with a warm prefix cache.
"""
from __future__ import annotations

import asyncio
import csv
import time
from pathlib import Path

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

from experiments.measuring import metrics
from experiments.soak.mix import INTERACTIVE

FIELDS = ("t_s", "rss_mib", "rss_front_mib", "rss_children_mib", "kv_blocks_used", "kv_blocks_total", "running", "waiting", "finished",
          "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "server_errors", "prefix_hit_rate",
          "spec_accept_rate")


def tree_rss(pid: int) -> tuple[int, int]:
    """Resident bytes of `pid`, and of all its descendants (the engine core), apart: a step in the
    tree's RSS is then placed in the front end or the core (0 for processes gone meanwhile)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    sizes = []
    for p in procs:
        try:
            sizes.append(p.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            sizes.append(0)
    return sizes[0], sum(sizes[1:])


def parse_metrics(text: str) -> dict:
    """The gauges and counters the soak reads, by name; `num_gpu_blocks` from cache_config_info."""
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if fam.name == "vllm:cache_config_info":
                out["num_gpu_blocks"] = int(s.labels.get("num_gpu_blocks", 0))
            elif not s.name.endswith(("_bucket", "_created")) and "position" not in s.labels:
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def scrape(http: aiohttp.ClientSession, base: str) -> dict:
    async with http.get(base + "/metrics") as resp:
        m = parse_metrics(await resp.text())
    total = m.get("num_gpu_blocks", 0)
    hits, queries = m.get("vllm:prefix_cache_hits_total", 0), m.get("vllm:prefix_cache_queries_total", 0)
    acc, drafts = m.get("vllm:spec_decode_num_accepted_tokens_total"), m.get("vllm:spec_decode_num_draft_tokens_total")
    return {"kv_blocks_used": round(m.get("vllm:kv_cache_usage_perc", 0.0) * total), "kv_blocks_total": total,
            "running": int(m.get("vllm:num_requests_running", 0)),
            "waiting": int(m.get("vllm:num_requests_waiting", 0)),
            "prefix_hit_rate": hits / queries if queries else None,
            "spec_accept_rate": acc / drafts if drafts else None}


async def wait_idle(http: aiohttp.ClientSession, base: str, timeout_s: float = 120.0) -> dict:
    """Poll /metrics until nothing runs or waits (twice in a row); the last scrape ({} if none answered)."""
    deadline, calm, failed, m = time.monotonic() + timeout_s, 0, 0, {}
    while time.monotonic() < deadline:
        try:
            m, failed = await scrape(http, base), 0
        except (aiohttp.ClientError, asyncio.TimeoutError):
            m, failed = {}, failed + 1
            if failed >= 5:  # a server that stopped answering: {} tells the verdicts
                break
        calm = calm + 1 if m.get("running") == 0 and m.get("waiting") == 0 else 0
        if calm >= 2:
            break
        await asyncio.sleep(0.5)
    return m


def latency(records: list[dict]) -> dict:
    """p50 / p99 TTFT and TPOT (ms) of the interactive, completed, uncut requests among `records`."""
    rows = [metrics.per_request(r) for r in records
            if r["kind"] in INTERACTIVE and r["status"] == 200 and r["done"] and not r["cut"]]
    ttft, tpot = metrics.stats(r["ttft_ms"] for r in rows), metrics.stats(r["tpot_ms"] for r in rows)
    return {"finished": len(rows), "ttft_p50_ms": ttft["median"], "ttft_p99_ms": ttft["p99"],
            "tpot_p50_ms": tpot["median"], "tpot_p99_ms": tpot["p99"]}


def server_error(rec: dict) -> bool:
    """A 5xx, or an error event inside a 200 stream (the server failed after answering)."""
    return (rec["status"] or 0) >= 500 or str(rec["error"] or "").startswith("in-stream")


class Sampler:
    """`await run(stop)`: one row every `period_s` until `stop` is set, appended to `csv_path` as it
    is taken; `records` is the soak's list of finished requests (read, never changed)."""

    def __init__(self, http: aiohttp.ClientSession, base: str, pid: int, t0_ns: int, period_s: float,
                 csv_path: Path, records: list[dict]):
        self.http, self.base, self.pid, self.t0_ns, self.period_s = http, base, pid, t0_ns, period_s
        self.csv_path, self.records, self.rows, self.seen = csv_path, records, [], len(records)

    async def sample(self) -> dict:
        new, self.seen = self.records[self.seen:], len(self.records)
        front, children = tree_rss(self.pid)
        row = {"t_s": round((time.perf_counter_ns() - self.t0_ns) / 1e9, 2),
               "rss_mib": round((front + children) / 2**20, 2), "rss_front_mib": round(front / 2**20, 2),
               "rss_children_mib": round(children / 2**20, 2)}
        try:
            row |= await scrape(self.http, self.base)
        except (aiohttp.ClientError, asyncio.TimeoutError):  # no answer: the row says so with empty gauges
            pass
        row |= latency(new)
        row["server_errors"] = sum(server_error(r) for r in self.records)
        self.rows.append(row)
        new_file = not self.csv_path.exists()
        with self.csv_path.open("a", newline="") as f:
            w = csv.DictWriter(f, FIELDS, extrasaction="ignore")
            if new_file:
                w.writeheader()
            w.writerow(row)
        return row

    async def run(self, stop: asyncio.Event) -> None:
        start = time.monotonic()
        while not stop.is_set():
            await self.sample()
            wait = self.period_s - (time.monotonic() - start) % self.period_s  # on a fixed grid, no drift
            try:
                await asyncio.wait_for(stop.wait(), wait)
            except asyncio.TimeoutError:
                pass
