"""Scrape a Prometheus text endpoint and read gauges out of it, for any server adapter.

`Metrics` indexes samples by their *sample* name (e.g. `vllm:prompt_tokens_total`),
not the family name, because prometheus_client's parser renames counter families
(drops `_total`) and that differs between text and OpenMetrics output.
A name may come in several label sets (vLLM engines, data-parallel ranks, TRT-LLM's
multiprocess collector): `value` sums them (counters, counts, capacities), `mean` averages
them (ratios such as KV usage: summing two ranks at 50 % would say 100 %).
`only=` keeps just the samples whose names start with the given prefixes, *before* parsing:
vLLM's /metrics is ~50 KB of histograms that take the full parser ~20 ms, which a harness
scraping every 100 ms cannot afford (it would perturb the engine it measures).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from adapters.base import MemorySnapshot
from adapters.transport.metric_names import MetricNames


@dataclass
class Metrics:
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, only: tuple[str, ...] | None = None) -> "Metrics":
        """Parse Prometheus text format (ValueError on malformed text); with `only`, just
        the sample lines whose names start with one of those prefixes."""
        if only:
            text = "\n".join(ln for ln in text.splitlines() if ln.startswith(only)) + "\n"
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        return cls(out)

    def __contains__(self, name: str) -> bool:
        return name in self.samples

    def value(self, *names: str) -> float | None:
        """The sum over label sets of the first of `names` present, or None (counters, counts)."""
        for name in names:
            if name in self.samples:
                return sum(v for _, v in self.samples[name])
        return None

    def mean(self, *names: str) -> float | None:
        """The mean over label sets of the first of `names` present, or None (ratios)."""
        for name in names:
            if self.samples.get(name):
                return sum(v for _, v in self.samples[name]) / len(self.samples[name])
        return None

    def labels(self, *names: str) -> dict[str, str] | None:
        """The labels of the first sample of the first of `names` present (info-style gauges)."""
        for name in names:
            if self.samples.get(name):
                return self.samples[name][0][0]
        return None


async def scrape(client: httpx.AsyncClient, url: str, only: tuple[str, ...] | None = None) -> Metrics | None:
    """GET `url` and parse it (see `Metrics.parse` for `only`); None when the server has no
    such endpoint or answers something that is not Prometheus text. Connection errors propagate."""
    resp = await client.get(url)
    if resp.status_code != 200:
        return None
    try:
        return Metrics.parse(resp.text, only)
    except ValueError:
        return None


def as_int(label: str | None) -> int | None:
    """A label value as an int ('None', '' or a non-number → None)."""
    try:
        return int(float(label)) if label not in (None, "", "None") else None
    except ValueError:
        return None


def kv_capacity(m: Metrics | None, names: MetricNames) -> tuple[int | None, int | None]:
    """(KV capacity in tokens, block size) from whichever gauges `names` has: a capacity gauge,
    blocks x tokens per block, or vLLM's cache_config_info labels. The capacity is one replica's:
    vLLM exports one cache_config_info sample per engine core (`engine` label), and under data
    parallelism each core is a replica with its own pool, asked the same per-GPU budget; the
    smallest is taken (they are equal unless a replica's memory differs)."""
    if m is None:
        return None, None
    per = m.value(*names.kv_block_tokens) if names.kv_block_tokens else None
    if names.kv_capacity and m.value(*names.kv_capacity) is not None:
        return int(m.value(*names.kv_capacity)), int(per) if per else None
    blocks = m.value(*names.kv_blocks) if names.kv_blocks else None
    if blocks is not None and per:
        return int(blocks) * int(per), int(per)
    for name in names.cache_info:
        caps, bs = [], None
        for labels, _ in m.samples.get(name, []):
            n, bs = as_int(labels.get("num_gpu_blocks")), as_int(labels.get("block_size"))
            caps.append(n * bs if n is not None and bs else None)
        if caps:  # one sample per engine core: a data-parallel replica each, with a KV pool of its own
            return (min(caps) if None not in caps else None), bs
    return None, int(per) if per else None


def snapshot(m: Metrics | None, names: MetricNames, capacity: int | None) -> MemorySnapshot:
    """KV usage and queue lengths now, by one engine's table. Tokens in use come from a
    tokens gauge, else used blocks x block size, else usage x `capacity`."""
    snap = MemorySnapshot(t_ns=time.perf_counter_ns(), kv_capacity_tokens=capacity)
    if m is None:
        return snap
    snap.kv_usage = m.mean(*names.kv_usage) if names.kv_usage else None
    used = m.value(*names.kv_used) if names.kv_used else None
    if used is None and names.kv_used_blocks:
        blocks, per = m.value(*names.kv_used_blocks), m.value(*names.kv_block_tokens)
        used = blocks * per if blocks is not None and per else None
    if used is None and snap.kv_usage is not None and capacity:
        used = snap.kv_usage * capacity
    snap.kv_used_tokens = round(used) if used is not None else None
    if snap.kv_usage is None and used is not None and capacity:
        snap.kv_usage = used / capacity
    for attr, alts in (("num_running", names.running), ("num_waiting", names.waiting)):
        v = m.value(*alts) if alts else None
        setattr(snap, attr, int(v) if v is not None else None)
    return snap
