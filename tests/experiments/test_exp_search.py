"""The SLO search's levels (experiments/running/search.py): how many requests a level sends, and that the run's
max_model_len holds every one of them (a grown level's prompts can be longer than the workload's own)."""
from __future__ import annotations

import math

from experiments.running import search
from experiments.running.runner import Plan
from experiments.workload import context, workloads
from experiments.workload.config import load
from tests.experiments.exp_util import write_config

BODY = """
engine = "reference"
[workload]
num_requests = 3
input_len = [4, 400]
output_len = 8
[load]
mode = "search"
[load.search]
start_rate = 2
max_levels = 3
level_s = 5
[slo]
ttft_ms = 100
"""


def test_level_size_is_the_workload_or_level_s_of_arrivals():
    assert search.level_size(2, 48, 30) == 60
    assert search.level_size(1, 48, 30) == 48  # the workload's own requests at least
    assert search.level_size(32, 48, 0) == 48  # level_s = 0: the workload alone (a burst at high rates)
    assert search.level_size(math.inf, 48, 30) == 48


def test_max_model_len_holds_every_request_a_level_may_send(exp_model, tmp_path):
    cfg = load(write_config(tmp_path / "c.toml", exp_model, BODY))
    items, warm = workloads.build(cfg.model, cfg.workload, 0)
    assert search.every_request(cfg).num_requests == 2 * 2 ** 2 * 5  # the top rate (8 req/s) for 5 s
    plan = Plan(cfg, tmp_path, items, warm, {})
    top = plan.items_for(40)
    assert len(top) == 40 and [it.prompt_token_ids for it in top[:3]] == [it.prompt_token_ids for it in items]
    assert plan.items_for(3) is items and plan.items_for(40) is top  # built once per size
    longest = context.longest_request(top)
    assert longest > context.longest_request(items)  # 3 draws of [4, 400] miss the longest of 40
    assert context.longest_request(search.sized(cfg, items)) == longest
    assert context.choose(cfg, search.sized(cfg, items) + warm, 8192) >= longest
