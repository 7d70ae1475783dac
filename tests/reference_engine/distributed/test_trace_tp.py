"""`inferlab trace --tensor-parallel-size 2`: each rank's weight-shard shapes and every all-reduce of each step."""
from __future__ import annotations

import json

from reference_engine.engine.trace import main


def test_trace_shows_shards_and_the_all_reduces_of_each_step(tiny_llama, capsys):
    assert main(["--model", str(tiny_llama), "--tensor-parallel-size", "2", "--max-tokens", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ranks = doc["config"]["tensor_parallel"]
    assert len(ranks) == 2 and ranks[0] == ranks[1]  # 8 heads, 2 KV heads: an even split
    assert ranks[0]["o_proj"] == [256, 128] and ranks[0]["down_proj"] == [256, 512]  # input columns halved
    prefill, decode = doc["steps"][0], doc["steps"][1]
    n = doc["config"]["requests"][0]["num_tokens"]
    layers = doc["config"]["layers"]
    assert [a["layer"] for a in prefill["allreduces"]] == [f"layers.{i}.{p}" for i in range(layers)
                                                           for p in ("o_proj", "down_proj")]
    assert all(a["shape"] == [n, 256] and a["bytes"] == n * 256 * 4 for a in prefill["allreduces"])
    assert all(a["shape"] == [1, 256] for a in decode["allreduces"]) and len(decode["allreduces"]) == 2 * layers
