"""`inferlab serve --data-parallel-size 2`: two engine cores behind one server, each pinned to its own CPU;
requests spread by the router, completions equal the offline engine's, /server_info and /metrics add up."""
from __future__ import annotations

import os

import httpx
import pytest


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two replicas need two CPUs")
def test_two_replicas_behind_one_server(launch, offline):
    s = launch("--data-parallel-size", "2", "--router", "round_robin")
    prompts = [[5, 6, 7, i] for i in range(4)]
    with httpx.Client(base_url=s.url, timeout=60, headers=s.headers) as c:
        texts = [c.post("/v1/completions", json={"model": c.get("/v1/models").json()["data"][0]["id"], "prompt": p,
                                                 "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                                                 "return_token_ids": True}).json() for p in prompts]
        info = c.get("/server_info").json()
    from reference_engine import SamplingParams

    want = offline.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert [t["choices"][0]["token_ids"] for t in texts] == [w.token_ids for w in want]
    eff = info["effective"]
    assert eff["data_parallel_size"] == 2 and eff["router"] == "round_robin"
    assert sorted(map(tuple, eff["replica_cpus"])) == sorted({tuple(c) for c in eff["replica_cpus"]})  # apart
    assert s.metrics()["vllm:generation_tokens_total"] == 24  # 4 requests x 6 tokens, summed over both cores
