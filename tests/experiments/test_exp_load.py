"""The arrival schedule and the request chains."""
from __future__ import annotations

import math

import numpy as np

from experiments.running.load import arrivals, chains
from experiments.workload.workloads import WorkItem


def test_poisson_schedule_is_seeded_with_the_right_rate():
    a = arrivals(4000, rate=20.0, seed=3)
    assert a == arrivals(4000, rate=20.0, seed=3) and a != arrivals(4000, rate=20.0, seed=4)
    gaps = np.diff(a)
    assert a[0] == 0.0 and (gaps >= 0).all()
    assert abs(gaps.mean() - 1 / 20) < 0.005
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1  # exponential: coefficient of variation 1


def test_gamma_burstiness_and_all_at_once():
    bursty = np.diff(arrivals(4000, rate=20.0, burstiness=0.25, seed=1))
    assert abs(bursty.mean() - 1 / 20) < 0.01
    assert bursty.std() / bursty.mean() > 1.7  # cv = 1/sqrt(0.25) = 2
    assert arrivals(5, rate=math.inf) == [0.0] * 5
    assert arrivals(0, rate=1.0) == []


def test_chains_keep_turn_order():
    items = [WorkItem("a-t0", [1], 1), WorkItem("a-t1", [1], 1, after="a-t0"), WorkItem("b", [1], 1),
             WorkItem("a-t2", [1], 1, after="a-t1")]
    assert [[i.request_id for i in c] for c in chains(items)] == [["a-t0", "a-t1", "a-t2"], ["b"]]


def test_open_loop_multi_turn_sends_each_turn_after_the_previous(tmp_path, exp_model, paced):
    import json

    from experiments.commands.run import run_main
    from tests.experiments.exp_util import write_config

    cfg = write_config(tmp_path / "c.toml", exp_model, """
        engine = "paced"
        [workload]
        kind = "multi_turn"
        num_requests = 3
        turns = 3
        input_len = 4
        output_len = 6
        [load]
        mode = "open"
        rate = [50, "inf"]
        warmup = 1
    """, name="mt")
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    recs = [json.loads(s) for s in (tmp_path / "res/mt/paced/requests.jsonl").read_text().splitlines()]
    assert {r["level"] for r in recs} == {"rate=50", "rate=inf"} and len(recs) == 18
    by = {(r["level"], r["request_id"]): r for r in recs}
    for (level, rid), r in by.items():
        conv, turn = rid.split("-t")
        if int(turn) > 0:
            prev = by[(level, f"{conv}-t{int(turn) - 1}")]
            assert r["send_ns"] >= prev["done_ns"]
            assert r["prompt_token_ids"][: len(prev["prompt_token_ids"])] == prev["prompt_token_ids"]
    # rate = inf: every conversation's first turn is sent at once
    firsts = sorted(r["send_ns"] for r in recs if r["level"] == "rate=inf" and r["request_id"].endswith("-t0"))
    assert firsts[-1] - firsts[0] < 20e6


def test_open_loop_max_concurrency_caps_requests_in_flight(tmp_path, exp_model, paced):
    import json

    from experiments.commands.run import run_main
    from tests.experiments.exp_util import write_config

    cfg = write_config(tmp_path / "c.toml", exp_model, """
        engine = "paced"
        [workload]
        num_requests = 12
        input_len = 4
        output_len = 6
        [load]
        mode = "open"
        rate = [2000, "inf"]
        max_concurrency = 3
        warmup = 0
    """, name="cap")
    assert run_main([str(cfg), "--out", str(tmp_path / "res"), "--no-progress"]) == 0
    recs = [json.loads(s) for s in (tmp_path / "res/cap/paced/requests.jsonl").read_text().splitlines()]
    assert len(recs) == 24

    def most_in_flight(level: str) -> int:
        rs = [r for r in recs if r["level"] == level]
        edges = sorted([(r["send_ns"], 1) for r in rs] + [(r["done_ns"], -1) for r in rs])
        return int(np.cumsum([d for _, d in edges]).max())

    assert most_in_flight("rate=2000") == 3  # all 12 arrive within ~6 ms, yet never more than 3 are sent
    assert most_in_flight("rate=inf") == 12  # "inf" is everything at once, uncapped
