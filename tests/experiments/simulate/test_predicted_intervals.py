"""The predicted-vs-measured errors carry bootstrap intervals (experiments/report/predicted.py `interval`):
over requests, and over server processes where a level ran in several; the report says whether the 10 % bar
is resolvable at that sample size."""
from __future__ import annotations

import random

from experiments.report.predicted import _ci, interval


def recs(ttfts_ms: list[float], repeat: int = 1) -> list[dict]:
    return [{"request_id": f"r{repeat}-{i}", "prompt_token_ids": [1], "output_token_ids": [1, 2], "send_ns": 0,
             "events": [(int(t * 1e6), 1), (int(t * 1e6) + 1_000_000, 1)], "repeat": repeat}
            for i, t in enumerate(ttfts_ms)]


def test_the_interval_covers_the_truth_and_narrows_with_the_sample():
    rng = random.Random(0)
    draw = lambda n: [rng.lognormvariate(4, 0.5) for _ in range(n)]  # noqa: E731
    few_lo, few_hi = interval(recs(draw(10)), recs(draw(10)), "ttft_ms", "median")
    many_lo, many_hi = interval(recs(draw(3000)), recs(draw(3000)), "ttft_ms", "median")
    assert few_lo < 0 < few_hi and many_lo < 0 < many_hi  # the same distribution: no error, within sampling
    assert many_hi - many_lo < (few_hi - few_lo) / 5
    assert _ci((few_lo, few_hi))[1] == "no" and _ci((many_lo, many_hi))[1] == "yes"


def test_processes_that_disagree_widen_the_interval():
    """Three server processes whose levels sit 30 % apart: resampling processes shows it; pooling hides it."""
    rng = random.Random(1)
    procs = [recs([s * rng.lognormvariate(4, 0.2) for _ in range(300)], repeat=i + 1) for i, s in enumerate((0.8, 1.0, 1.2))]
    pred = recs([rng.lognormvariate(4, 0.2) for _ in range(900)])
    by_proc = interval([r for p in procs for r in p], pred, "ttft_ms", "median")
    pooled = interval([{**r, "repeat": 1} for p in procs for r in p], pred, "ttft_ms", "median")
    assert by_proc[1] - by_proc[0] > 3 * (pooled[1] - pooled[0])
