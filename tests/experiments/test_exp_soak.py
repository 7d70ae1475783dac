"""scripts/soak.py's mechanism, end to end on the tiny random model: `make soak` runs it for 30 minutes on
the real model after an SLO search; here it runs 24 s at a fixed rate (no search) with `--mechanism`, so
the timing verdicts (RSS slope, latency drift) are printed unjudged and nothing here bounds a time.
What must hold whatever the machine's speed: the server started and stopped, samples were taken, the
page and its plot were written with every verdict line, no 5xx, every invalid request got a 4xx, streams
were cut, the probes compared equal, and every KV block was back in the pool once idle."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from experiments.soak import load, verdict
from experiments.soak.mix import DECK, plan

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_soak_mechanism_on_the_tiny_model(tiny_llama, tmp_path):
    out, run = tmp_path / "out", tmp_path / "run"
    # 0.4 min at 4 req/s: 2.4 of the mix's 40-request decks (experiments/soak/mix.py), so every kind is sent.
    p = subprocess.run([sys.executable, "-m", "experiments.soak", "--model", str(tiny_llama), "--minutes", "0.4",
                        "--rate", "4", "--mechanism", "--out", str(out), "--run-dir", str(run), "--sample-s", "3",
                        "--max-model-len", "512", "--kv-cache-tokens", "8192"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)  # a hang guard, not a bound
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]

    (md,) = out.glob("*-soak.md")
    assert md.with_suffix(".png").stat().st_size > 0
    page = md.read_text()
    for name in verdict.NAMES:
        want = "SKIP" if name in verdict.TIMING else "PASS"
        assert f"VERDICT {name}: {want} — " in page, name
    assert "(mechanism run: not judged)" in page and "--mechanism" in page

    rows = list(csv.DictReader((run / "samples.csv").open()))
    assert len(rows) >= 5  # one every 3 s over 24 s and the drain
    assert all(float(r["rss_mib"]) > 100 and r["kv_blocks_total"] == "512" for r in rows)  # 8192 tokens / 16

    recs = [json.loads(line) for line in (run / "requests.jsonl").open()]
    kinds = Counter(r["kind"] for r in recs)
    assert {"chat", "multi", "long", "cut", "invalid", "nbest", "logprobs", "warmup"} <= set(kinds)
    assert kinds["probe"] == 10  # five at the start, five at the end
    assert not [r for r in recs if (r["status"] or 0) >= 500 or r["error"]]
    assert kinds["invalid"] >= 4 and all(400 <= r["status"] < 500 for r in recs if r["kind"] == "invalid")
    assert sum(r["cut"] for r in recs) >= 4
    for r in (r for r in recs if r["kind"] == "long"):  # near the context's end, never past it
        prompt = len(r["prompt_token_ids"])
        assert 512 - 2 * 48 <= prompt <= prompt + len(r["output_token_ids"]) <= 512
    assert any(r["logprob_chunks"] for r in recs if r["kind"] == "logprobs")
    assert all(len(r["finish"]) == 2 for r in recs if r["kind"] == "nbest")


def test_every_window_of_one_period_holds_the_same_arrivals():
    # The drift verdict compares the first window after warm-up with the last: the load must put the
    # same requests in both (a fresh Poisson draw per window gave 424 vs 473 requests in one run).
    warm, (a, b), (c, d) = verdict.windows(1800)
    line = load.timeline(1.5, 1800, b - a, seed=0)
    first = [(round(t - a, 6), s) for t, s in line if a <= t < b]
    assert first == [(round(t - c, 6), s) for t, s in line if c <= t < d]
    assert 300 < len(first) < 600 and all(0 <= x < b - a for x, _ in first)
    # a window off the period's grid (the 15-minute run's, 180-480 s) holds the same slots too
    w, (e, f), _ = verdict.windows(900)
    assert Counter(s for t, s in load.timeline(1.5, 900, f - e, seed=0) if e <= t < f) == Counter(s for _, s in first)
    assert load.timeline(1.5, 1800, 300, seed=1) != line  # the seed draws it


def test_plan_holds_the_deck_shares_in_every_40():
    slots = plan(400, seed=3)
    assert slots == plan(400, seed=3) and len({s.seed for s in slots}) > 390
    for k in range(0, 400, 40):
        assert Counter(s.kind for s in slots[k:k + 40]) == Counter(DECK)
