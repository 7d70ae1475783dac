"""Scrape a Prometheus text endpoint and read gauges out of it, for any server adapter.

`Metrics` indexes samples by their *sample* name (e.g. `vllm:prompt_tokens_total`),
not the family name, because prometheus_client's parser renames counter families
(drops `_total`) and that differs between text and OpenMetrics output.
Values of one name are summed over label sets (several engines / data-parallel ranks).
`only=` keeps just the samples whose names start with the given prefixes, *before* parsing:
vLLM's /metrics is ~50 KB of histograms that take the full parser ~20 ms, which a harness
scraping every 100 ms cannot afford (it would perturb the engine it measures).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families


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
        """The sum over label sets of the first of `names` present, or None."""
        for name in names:
            if name in self.samples:
                return sum(v for _, v in self.samples[name])
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
