"""The SGLang adapter against SGLang's own code (pinned in scripts/setup_sglang_venv.sh),
run by tests/adapters/sglang_contract.py inside .venv-sglang: our launch command parses with
SGLang's argument parser, our request bodies validate against its request models, and the
names and behaviours the adapter relies on are in its installed source. Under CI (which
makes the venv: .ci/run) a missing .venv-sglang is a failure, elsewhere a skip."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.base import GenerationRequest, SamplingConfig
from adapters.engines.sglang.adapter import KNOBS, sampling_params
from adapters.engines.sglang.settings import SGLANG
from adapters.registry import create
from adapters.transport.launcher import Launcher
from adapters.transport.openai import OpenAIEngine

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-sglang"
SPEC_KEYS = ["speculative_algorithm", "speculative_num_draft_tokens", "speculative_num_steps", "speculative_eagle_topk",
             "speculative_draft_model_path", "speculative_ngram_max_bfs_breadth"]
NAMESPACE_KEYS = ["model_path", "host", "port", "dtype", "enable_metrics", "log_level", "max_total_tokens",
                  "mem_fraction_static", "max_running_requests", "chunked_prefill_size", "page_size",
                  "disable_radix_cache", "cuda_graph_backend_decode", "cuda_graph_backend_prefill", "tp_size",
                  "attention_backend", "incremental_streaming_output", "pp_size", "dp_size", *SPEC_KEYS]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3}
DRAFT = {"method": "draft_model", "num_speculative_tokens": 4, "model": "/models/qwen-draft"}
OPTION_SETS = [
    ({}, "float32"),
    ({"kv_cache_tokens": 4096, "mem_fraction_static": 0.8, "max_running_requests": 16, "chunked_prefill_size": 512,
      "page_size": 16, "disable_radix_cache": True, "disable_cuda_graph": True, "tp_size": 2,
      "attention_backend": "triton"}, "bfloat16"),
    ({"kv_cache_tokens": 1024}, "float16"),
    ({"enable_prefix_caching": False, "speculative_config": NGRAM}, "bfloat16"),
    ({"enable_prefix_caching": True, "speculative_config": DRAFT}, "float16"),
    ({"parallel": {"tensor": 2, "pipeline": 3, "data": 4}}, "bfloat16"),  # the config's [parallel] block
]
# what each feature option set must parse to (ServerArgs field -> value; None: left at its default)
FEATURE_NAMESPACES = {
    3: {"disable_radix_cache": True, "speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 4,
        "speculative_ngram_max_bfs_breadth": 1, "speculative_num_steps": None, "speculative_draft_model_path": None},
    4: {"disable_radix_cache": False, "speculative_algorithm": "STANDALONE", "speculative_num_draft_tokens": 5,
        "speculative_num_steps": 4, "speculative_eagle_topk": 1, "speculative_draft_model_path": "/models/qwen-draft"},
}
SAMPLINGS = [SamplingConfig(), SamplingConfig(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, seed=7,
                                             max_tokens=64, ignore_eos=False, stop=["\n", "END"])]


def argv_for(options: dict, dtype: str, tmp_path, monkeypatch) -> list[str]:
    """The launch command the adapter builds for an installed SGLang 0.5.23 (its version table's row)."""
    from tests.adapters.test_sglang import installed_version

    installed_version(tmp_path, monkeypatch, "0.5.23")
    e = create("sglang", "/models/qwen", dtype, {"launcher": sys.executable, **options})
    e.server.launcher, e.server.port = Launcher.parse(sys.executable), 30000
    argv = e.server_argv()
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    return argv[3:]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if not (VENV / "bin" / "python").exists():
        if os.environ.get("CI"):
            pytest.fail(".venv-sglang is absent although .ci/run makes it (make sglang)")
        pytest.skip(".venv-sglang is absent: run scripts/setup_sglang_venv.sh (make sglang)")
    mp = pytest.MonkeyPatch()
    try:
        argvs = [argv_for(o, d, tmp_path_factory.mktemp("pkg"), mp) for o, d in OPTION_SETS]
    finally:
        mp.undo()
    reqs = [GenerationRequest(f"r{i}", [5, 6, 7], s) for i, s in enumerate(SAMPLINGS)]
    ids_engine = OpenAIEngine("m", "float32", {"url": "http://x", "served_model_name": "m"})
    text_engine = OpenAIEngine("m", "float32", {"url": "http://x", "served_model_name": "m"})
    text_engine.events_carry_token_ids = False  # as after a probe that saw no ids
    request = {"argvs": argvs, "namespace_keys": NAMESPACE_KEYS, "vocab_size": 32000,
               "sampling_params": [sampling_params(r) for r in reqs],
               "completion_bodies": [e._completion_body(r) for e in (ids_engine, text_engine) for r in reqs]}
    out = subprocess.run([str(VENV / "bin" / "python"), str(REPO / "tests/adapters/sglang_contract.py")],
                         input=json.dumps(request), capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-4000:]
    return {"request": request, **json.loads(out.stdout)}


def test_pinned_version(report):
    assert report["version"] == "0.5.23"


def test_launch_commands_parse_with_sglangs_own_parser(report):
    for argv, res, (options, dtype) in zip(report["request"]["argvs"], report["argv"], OPTION_SETS):
        assert res["ok"], (argv, res.get("error"))
        ns = res["namespace"]
        assert (ns["model_path"], ns["dtype"], ns["enable_metrics"], ns["port"]) == ("/models/qwen", dtype, True, 30000)
        assert ns["max_total_tokens"] == options.get("kv_cache_tokens")
        for k in set(KNOBS) & set(options) - {"disable_cuda_graph"}:
            assert ns[k] == options[k], k
        if not set(options) & {"enable_prefix_caching", "speculative_config"}:
            assert ns["speculative_algorithm"] is None and ns["disable_radix_cache"] is options.get(
                "disable_radix_cache", False)
        if options.get("disable_cuda_graph"):
            assert ns["cuda_graph_backend_decode"] == ns["cuda_graph_backend_prefill"] == "disabled"
        assert res["deprecated"] == [], res["deprecated"]  # e.g. --disable-cuda-graph would print a notice
        assert ns["incremental_streaming_output"] is False  # the key the adapter reads from /server_info
    assert {"float32", "bfloat16", "float16"} <= set(report["dtype_choices"])


def test_generate_bodies_validate_against_sglangs_request_models(report):
    assert all(r["ok"] for r in report["sampling"]), report["sampling"]
    body = {"input_ids": [5, 6, 7], "sampling_params": {}, "stream": True, "rid": "r"}  # as SGLangServer.generate
    assert set(body) <= set(report["generate_fields"])


def test_openai_bodies_validate_against_sglangs_completion_request(report):
    """For the `openai` adapter pointed at SGLang's OpenAI route: every field we send is one
    SGLang's CompletionRequest knows (none lands in extras), ids and text-only bodies alike."""
    for body, res in zip(report["request"]["completion_bodies"], report["completion"]):
        assert res["ok"], res.get("error")
        assert res["extra"] == [] and set(body) <= set(res["set"]), (body, res)


def test_metric_table_names_are_in_sglangs_collector(report):
    names = set(report["metric_names"])
    used = {*SGLANG.kv_usage, *SGLANG.running, *SGLANG.waiting, *SGLANG.kv_capacity, *SGLANG.kv_used,
            *(n for alts in SGLANG.counters().values() for n in alts),
            *(n for alts in SGLANG.rates().values() for n in alts)}
    assert SGLANG.rates(), "the SGLANG row lost its rate gauges"
    assert used <= names, used - names
    assert {h for h in SGLANG.histograms().values()} <= names


def test_recorded_engine_behaviour_behind_the_in_process_fixes(report):
    """What test_sglang's fake Engine imitates (defect 4), in SGLang's own source: the sync
    helpers drive `self.loop` with run_until_complete; the flush result has `success`."""
    calls = report["engine_calls"]
    assert "self.loop.run_until_complete" in calls["get_server_info"]
    assert "self.loop.run_until_complete" in calls["flush_cache"]
    assert "asyncio.get_running_loop" in calls["_ensure_event_loop"]
    assert "success" in report["flush_output_fields"]
    assert report["scheduler_info_has_max_total_num_tokens"] and report["max_total_tokens_is_an_upper_bound"]


def test_feature_flags_parse_to_what_they_mean(report):
    """The uniform features (adapters.common.features) as SGLang's own parser reads our flags: prefix caching
    off is --disable-radix-cache; n-gram is NGRAM with k+1 draft tokens (SGLang counts the verified
    root: metrics_reporter's drafts per round = num_draft_tokens - 1) in one chain (topk = max BFS
    breadth = 1); a draft model is STANDALONE with k steps, topk 1, k+1 draft tokens (its own
    auto-chosen triple is (3, 1, 4))."""
    for i, want in FEATURE_NAMESPACES.items():
        res = report["argv"][i]
        assert res["ok"] and res["deprecated"] == [], res
        assert {k: res["namespace"][k] for k in want} == want
    assert {"NGRAM", "STANDALONE"} <= set(report["spec_algorithms"])
    assert report["ngram_topk_is_max_bfs_breadth"] and report["standalone_auto_params"]
    assert report["drafts_per_round_exclude_root"]


def test_server_info_keys_the_adapter_reads_are_sglangs(report):
    """/server_info = ServerArgs.resolved_dict() (one key per record field) + scheduler info +
    internal_states; adapters.engines.sglang.settings.read_back reads these keys."""
    from adapters.engines.sglang.settings import SERVER_INFO_KEYS

    assert report["server_info_is_resolved_dict"]
    assert set(SERVER_INFO_KEYS) <= set(report["server_info_fields"]), \
        set(SERVER_INFO_KEYS) - set(report["server_info_fields"])
    assert report["internal_state_has_max_running"] and report["memory_usage_in_gib"]
    assert {"weight", "kvcache", "graph", "token_capacity"} <= set(report["memory_usage_keys"])


def test_cuda_graphs_are_read_from_the_resolved_record(report):
    """/server_info's cuda_graph_config is the resolved CudaGraphConfig expanded to dicts
    (server_args._plain), so decode.backend is where read_back looks (issue 25, defect 4)."""
    assert report["resolved_dict_expands_records"] and "cuda_graph_config" in report["server_info_fields"]
    assert {"decode", "prefill"} <= set(report["cuda_graph_config_fields"])
    assert "backend" in report["cuda_graph_phase_fields"]


def test_parallel_block_parses_to_sglangs_sizes(report):
    """[parallel] tensor/pipeline/data (adapters/common/parallel.py) as SGLang's own parser reads --tp-size,
    --pp-size and --dp-size (ServerArgs tp_size, pp_size, dp_size)."""
    res = report["argv"][5]
    assert res["ok"] and res["deprecated"] == [], res
    assert (res["namespace"]["tp_size"], res["namespace"]["pp_size"], res["namespace"]["dp_size"]) == (2, 3, 4)
