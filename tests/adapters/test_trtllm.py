"""TensorRT-LLM adapter against facts recorded from TensorRT-LLM's own source
(fixtures/trtllm/facts.json; SOURCE.md names file and commit for each). No trtllm-serve runs
here: the replay server answers as those facts say trtllm-serve does (HTTP 400 for a body
field its request model forbids, token ids only with detokenize false), with streams *built*
from the recorded chunk shapes."""
from __future__ import annotations

import json
import sys

import pytest

from adapters.base import UNKNOWN_TOKEN_ID, EngineUnavailable, GenerationRequest, SamplingConfig
from adapters.checks.dryrun import facts as upstream
from adapters.engines.trtllm.adapter import DTYPES, INSTALL, TRTLLM, llm_api_options
from adapters.registry import create
from tests.adapters.adapter_util import check_stream, tokens
from tests.adapters.replay import Replay, facts
from tests.adapters.test_tgi import fake_venv

FACTS = facts("trtllm")
UPSTREAM = upstream("trtllm")  # read at v1.3.0rc24 (adapters/engines/trtllm/upstream.json; fixtures/trtllm/SOURCE.md)
REQ = FACTS["completion_request"]  # openai_protocol.py @ 0076e939: fields, extra="forbid"


def forbid_unknown(body: dict) -> str | None:
    """What trtllm-serve's pydantic models (extra="forbid") say about this body, or None."""
    unknown = sorted(set(body) - set(REQ["fields"]))
    unknown += sorted(f"stream_options.{k}" for k in set(body.get("stream_options") or {})
                      - set(REQ["stream_options_fields"]))
    return f"Extra inputs are not permitted: {unknown}" if unknown else None


def chunk(text: str, ids: list[int] | None, done: int, finish: str | None = None) -> bytes:
    c = {"index": 0, "text": text, "token_ids": ids, "finish_reason": finish, "stop_reason": None}
    return b"data: " + json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "tiny", "choices": [c],
                                   "usage": {"prompt_tokens": 3, "completion_tokens": done,
                                             "total_tokens": 3 + done}}).encode() + b"\n\n"


def built_stream(body: dict, steps: list[list[int]]) -> bytes:
    """A completion stream shaped as completion_stream_post_processor (postprocess_handlers.py
    @ 01bf1923) shapes it: text "" and the new ids with detokenize false, text and null ids
    otherwise; running usage per chunk with continuous_usage_stats; a final usage chunk."""
    detok = body.get("detokenize", REQ["defaults"]["detokenize"])
    opts = body.get("stream_options") or {}
    out, done = b"", 0
    for i, ids in enumerate(steps):
        done += len(ids)
        text = "x" if i else ""  # the first token is half a UTF-8 character: no text yet
        c = json.loads(chunk("" if not detok else text, None if detok else ids, done,
                             "length" if i == len(steps) - 1 else None)[6:])
        if not opts.get("continuous_usage_stats"):
            c.pop("usage")
        out += b"data: " + json.dumps(c).encode() + b"\n\n"
    if opts.get("include_usage"):
        out += b"data: " + json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "tiny", "choices": [],
                                       "usage": {"prompt_tokens": 3, "completion_tokens": done,
                                                 "total_tokens": 3 + done}}).encode() + b"\n\n"
    return out + b"data: [DONE]\n\n"


def trtllm_routes(steps: list[list[int]], metrics: bytes | None = None) -> dict:
    def completions(body):
        err = forbid_unknown(body)
        if err:
            return REQ["validation_error_status"], "application/json", json.dumps({"error": err}).encode()
        return 200, "text/event-stream", built_stream(body, steps if body["max_tokens"] > 1 else steps[:1])

    routes = {("GET", "/v1/models"): (200, "application/json", b'{"object":"list","data":[{"id":"tiny"}]}'),
              ("GET", "/version"): (200, "application/json", b'{"version":"1.3.0rc24"}'),
              ("POST", "/v1/completions"): completions}
    if metrics is not None:
        routes[("GET", "/prometheus/metrics")] = (200, "text/plain; version=0.0.4", metrics)
    return routes


def gauges(max_blocks: int, per_block: int, dtype: str = "bfloat16") -> bytes:
    """Prometheus text with the recorded gauge names (collector.py @ 050f80de) and labels."""
    lab = 'model_name="undefined",engine_type="undefined"'
    return (f'trtllm_kv_cache_max_blocks{{{lab}}} {max_blocks}.0\n'
            f'trtllm_kv_cache_tokens_per_block{{{lab}}} {per_block}.0\n'
            f'trtllm_kv_cache_used_blocks{{{lab}}} 2.0\n'
            f'trtllm_kv_cache_utilization{{{lab}}} 0.25\n'
            f'trtllm_num_requests_running{{{lab}}} 1.0\n'
            f'trtllm_num_requests_waiting{{{lab}}} 0.0\n'
            f'trtllm_model_config_info{{{lab},model="/m",served_model_name="m",dtype="{dtype}",quantization="none"}} 1.0\n'
            ).encode()


async def test_server_mode_starts_against_trtllm_strict_request_model():
    """Defect 1. facts: completion_request (openai_protocol.py @ 0076e939: extra="forbid", no
    return_token_ids, detokenize) and stream (postprocess_handlers.py @ 01bf1923). Before the
    fix the start-up probe sent return_token_ids and trtllm-serve answered 400."""
    steps = [[11], [12, 13], [14]]
    with Replay(trtllm_routes(steps)) as srv:
        e = create("trtllm", "/m/tiny", "bfloat16", {"url": srv.url})
        info = await e.start()
        events = [ev async for ev in e.generate(GenerationRequest("r", [1, 2, 3], SamplingConfig(max_tokens=4)))]
        await e.stop()
    bodies = srv.posted("/v1/completions")
    assert all(forbid_unknown(b) is None for b in bodies)
    assert all(b["detokenize"] is False and "return_token_ids" not in b for b in bodies)
    assert info.knobs["events_carry_token_ids"] is True and "token_ids" not in info.unhonoured
    check_stream(events, "r")
    assert tokens(events) == [11, 12, 13, 14] and events[-1].completion_tokens == 4


async def test_text_only_stream_counts_tokens_from_running_usage():
    """Defect 1 (fallback). facts: stream (postprocess_handlers.py @ 01bf1923): with detokenize
    true the chunks carry text and no ids, and continuous_usage_stats gives the running count.
    One chunk here holds two tokens and one decodes to no text: one-per-non-empty-chunk counted 2."""
    steps = [[11], [12, 13], [14]]  # built_stream: texts "", "x" (two tokens), "x": 2 non-empty chunks
    with Replay(trtllm_routes(steps)) as srv:
        e = create("trtllm", "/m/tiny", "bfloat16", {"url": srv.url, "return_token_ids": False})
        info = await e.start()
        events = [ev async for ev in e.generate(GenerationRequest("r", [1, 2, 3], SamplingConfig(max_tokens=4)))]
        await e.stop()
    assert info.knobs["events_carry_token_ids"] is False
    assert "running usage" in info.unhonoured["token_ids"]
    assert tokens(events) == [UNKNOWN_TOKEN_ID] * 4 and [len(ev.token_ids) for ev in events] == [1, 2, 1]
    assert srv.posted("/v1/completions")[-1]["stream_options"]["continuous_usage_stats"] is True


def test_options_file_turns_on_metrics_and_carries_dtype_and_kv(tmp_path):
    """Defect 2. Checked against the tag's tables (adapters/engines/trtllm/upstream.json: serve_flags from
    tensorrt_llm/commands/serve.py @ v1.3.0rc24, llm_args from llm_args.py @ v1.3.0rc24: no --dtype;
    dtype, return_perf_metrics, enable_iter_perf_stats, kv_cache_config fields). The free-memory
    fraction goes into the file's kv_cache_config (the file is merged over the command line)."""
    e = create("trtllm", "/models/llama", "bfloat16", {"launcher": str(tmp_path / "venv"), "kv_cache_tokens": 8192,
                                                   "kv_cache_free_gpu_memory_fraction": 0.9, "max_batch_size": 64})
    s = e.server
    (tmp_path / "venv").mkdir()
    s.launcher, s.port, s.work_dir = fake_venv(tmp_path / "venv", "trtllm-serve"), 8000, tmp_path
    argv = e.server_argv()
    assert argv == [str(tmp_path / "venv" / "bin" / "trtllm-serve"), "/models/llama", "--host", "127.0.0.1",
                    "--port", "8000", "--max_batch_size", "64",
                    "--extra_llm_api_options", str(tmp_path / "llm_api_options.yaml")]
    tag = UPSTREAM
    assert {a for a in argv if a.startswith("--")} <= set(tag["serve_flags"]["options"])
    assert "--dtype" not in tag["serve_flags"]["options"]
    opts = json.loads(e.server_files()[str(tmp_path / "llm_api_options.yaml")])
    assert opts == {"dtype": "bfloat16", "return_perf_metrics": True, "enable_iter_perf_stats": True,
                    "enable_chunked_prefill": True,
                    "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "max_tokens": 8192}}
    assert set(opts) <= set(tag["llm_args"]["pytorch"])
    assert set(opts["kv_cache_config"]) <= set(tag["llm_args"]["kv_cache_config"])
    # without a budget the file still turns metrics on
    assert llm_api_options({}, "float16") == {"dtype": "float16", "return_perf_metrics": True,
                                              "enable_iter_perf_stats": True, "enable_chunked_prefill": True}


async def test_capacity_metrics_url_and_unpinned_budget_from_prometheus_gauges():
    """Defect 2. facts: metrics (collector.py @ 050f80de: gauge names, labels, model_config_info)
    and server_routes (openai_server.py @ 00057725: /prometheus/metrics). max_tokens is an upper
    bound (llm_args: "the minimum will be used"): 100 blocks of 32 ran although 4096 was asked."""
    with Replay(trtllm_routes([[5]], gauges(100, 32, dtype="float16"))) as srv:
        e = create("trtllm", "/m/tiny", "bfloat16", {"url": srv.url, "kv_cache_tokens": 4096})
        info = await e.start()
        snap = await e.snapshot()
        await e.stop()
    assert (info.kv_capacity_tokens, info.block_size) == (3200, 32)
    assert info.metrics_url == srv.url + "/prometheus/metrics" == srv.url + TRTLLM.path
    assert "3200" in info.unhonoured["kv_cache_tokens"] and "4096" in info.unhonoured["kv_cache_tokens"]
    assert info.dtype == "float16" and "bfloat16 was asked" in info.unhonoured["dtype"]
    assert (snap.kv_capacity_tokens, snap.kv_used_tokens, snap.kv_usage, snap.num_running) == (3200, 64, 0.25, 1)


def test_metric_table_uses_recorded_names():
    """facts: metrics (collector.py @ 050f80de)."""
    m = FACTS["metrics"]
    assert set(TRTLLM.histograms().values()) <= set(m["histograms"])
    assert {n for alts in TRTLLM.counters().values() for n in alts} <= set(m["counters"])
    gauges_used = {*TRTLLM.kv_usage, *TRTLLM.running, *TRTLLM.waiting, *TRTLLM.kv_blocks, *TRTLLM.kv_used_blocks,
                   *TRTLLM.kv_block_tokens, *TRTLLM.model_info}
    assert gauges_used <= set(m["gauges"])
    assert {n for alts in TRTLLM.rates().values() for n in alts} <= set(m["gauges"]) and TRTLLM.rates()
    assert TRTLLM.path == "/prometheus/metrics" and "/prometheus/metrics" in FACTS["server_routes"]["prometheus"]


async def test_missing_trtllm_is_engine_unavailable(tmp_path):
    e = create("trtllm", "m", "bfloat16", {"launcher": sys.executable, "work_dir": str(tmp_path)})
    with pytest.raises(EngineUnavailable, match="trtllm-serve.*release container"):
        await e.start()
    with pytest.raises(EngineUnavailable, match="tensorrt_llm"):
        await create("trtllm", "m", "bfloat16", {"mode": "in_process"}).start()


@pytest.mark.parametrize("mode", ["server", "in_process"])
def test_float32_is_refused_before_launch_in_one_line(mode):
    """Defect 4 of issue 38: TensorRT-LLM's custom kernels do not support float32
    (NVIDIA/TensorRT-LLM#5260; upstream/trtllm.json dtypes); the config error names what does run."""
    with pytest.raises(ValueError) as err:
        create("trtllm", "m", "float32", {"mode": mode})
    assert str(err.value) == ("engine 'trtllm': dtype 'float32' is not supported by TensorRT-LLM's kernels "
                              "(NVIDIA/TensorRT-LLM#5260); use one of bfloat16, float16")
    assert set(DTYPES) <= set(UPSTREAM["dtypes"]["supported"]) and "float32" not in UPSTREAM["dtypes"]["supported"]


def test_chat_requests_carry_no_detokenize_and_count_tokens_from_usage():
    """Defect 3 of issue 38: ChatCompletionRequest has no `detokenize` and forbids unknown fields
    (upstream/trtllm.json requests, openai_protocol.py near v1.3.0rc24): every chat request got a 400."""
    impl = create("trtllm", "m", "bfloat16", {"url": "http://127.0.0.1:9"})
    impl.served_model_name = "m"
    req = GenerationRequest("c", [1, 2], SamplingConfig(max_tokens=4), messages=[{"role": "user", "content": "hi"}])
    route, body = impl.request_body(req)
    chat = UPSTREAM["requests"]["/v1/chat/completions"]
    assert route == "/v1/chat/completions" and "detokenize" not in body
    assert set(body) <= set(chat["fields"]) | set(chat["aliases"])
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert set(body["stream_options"]) <= set(UPSTREAM["requests"]["stream_options"]["fields"])
    route, body = impl.request_body(GenerationRequest("p", [1, 2], SamplingConfig(max_tokens=4)))
    assert route == "/v1/completions" and body["detokenize"] is False  # the completion route streams ids


def test_install_hint_is_not_the_old_stub_index():
    """Defect 2: the hint pointed at NVIDIA's extra index (the old PyPI stub's source)."""
    assert "pypi.nvidia.com" not in INSTALL and "nvcr.io/nvidia/tensorrt-llm/release" in INSTALL


def test_features_go_into_the_options_file():
    """facts: speculative (llm_args.py @ 00043967: decoding_type NGram / Draft_Target, max_draft_len,
    speculative_model; ngram.py: a public pool by default, match sizes down to 1),
    kv_cache_config_reuse (enable_block_reuse, default true)."""
    f = FACTS["speculative"]
    ngram = llm_api_options({"enable_prefix_caching": False, "speculative_config": {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}}, "float16")
    assert ngram["kv_cache_config"] == {"enable_block_reuse": False}
    assert ngram["speculative_config"] == {"decoding_type": f["decoding_types"]["ngram"], "max_draft_len": 3,
                                           "max_matching_ngram_size": 4, "is_public_pool": False}
    assert set(ngram["speculative_config"]) - {"decoding_type"} <= set(f["base_fields"] + f["ngram_fields"])
    draft = llm_api_options({"speculative_config": {"model": "/d", "num_speculative_tokens": 2}}, "float16")
    assert draft["speculative_config"] == {"decoding_type": f["decoding_types"]["draft_model"], "max_draft_len": 2,
                                           "speculative_model": "/d"}
    assert "kv_cache_config" not in draft  # block reuse left at TensorRT-LLM's default (on)
    assert FACTS["kv_cache_config_reuse"]["field"] in FACTS["llm_args"]["kv_cache_config_fields"]
    with pytest.raises(ValueError, match="contradict"):
        create("trtllm", "m", "float16", {"enable_prefix_caching": True, "enable_block_reuse": False})
    with pytest.raises(ValueError, match=r"backend 'tensorrt' is not one of \['pytorch'\]"):
        create("trtllm", "m", "float16", {"backend": "tensorrt"})  # gone at 1.3.0rc24 (--backend pytorch|_autodeploy)


def config_gauges(spec: dict | None, reuse: bool) -> bytes:
    """The config info gauges and batch gauges (facts config_info: label names; values made up)."""
    lab = 'model_name="undefined",engine_type="undefined"'
    out = (f'trtllm_parallel_config_info{{{lab},tensor_parallel_size="2",pipeline_parallel_size="1",'
           f'context_parallel_size="1",gpu_count="2"}} 1.0\n'
           f'trtllm_kv_cache_config_info{{{lab},enable_block_reuse="{reuse}",free_gpu_memory_fraction="0.9"}} 1.0\n'
           f'trtllm_max_num_active_requests{{{lab}}} 64.0\n'
           f'trtllm_max_num_tokens_runtime{{{lab}}} 8192.0\n'
           f'trtllm_kv_cache_hit_rate{{{lab}}} 0.5\n')
    if spec:
        out += (f'trtllm_speculative_config_info{{{lab},spec_enabled="true",spec_method="{spec["spec_method"]}",'
                f'spec_num_tokens="{spec["spec_num_tokens"]}"}} 1.0\n')
    return out.encode()


async def test_settings_read_back_from_the_config_gauges():
    names = FACTS["config_info"]
    assert {"spec_method", "spec_num_tokens"} <= set(names["speculative_config_info"])
    assert "enable_block_reuse" in names["kv_cache_config_info"] and "trtllm_kv_cache_hit_rate" in names["gauges"]
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    metrics = gauges(100, 32) + config_gauges({"spec_method": "NGram", "spec_num_tokens": 3}, reuse=False)
    with Replay(trtllm_routes([[5]], metrics)) as srv:
        e = create("trtllm", "/m/tiny", "bfloat16", {"url": srv.url, "enable_prefix_caching": True,
                                                 "speculative_config": ngram})
        info = await e.start()
        await e.stop()
    eff = info.effective
    assert {k: eff[k] for k in ("dtype", "tensor_parallel_size", "prefix_caching", "kv_blocks", "block_size",
                                "kv_capacity_tokens", "max_num_seqs", "max_num_batched_tokens", "speculative")} == {
        "dtype": "bfloat16", "tensor_parallel_size": 2, "prefix_caching": False, "kv_blocks": 100, "block_size": 32,
        "kv_capacity_tokens": 3200, "max_num_seqs": 64, "max_num_batched_tokens": 8192,
        "speculative": {"method": "ngram", "num_speculative_tokens": 3}}
    assert "reports false" in info.unhonoured["enable_prefix_caching"]  # the server runs without block reuse
    assert "speculative_config" not in info.unhonoured  # NGram with 3 drafts, as asked
    assert "prompt_lookup_min 2" in info.unhonoured["speculative_config.prompt_lookup_min"]
    assert info.memory == {}  # trtllm-serve exports no memory split
    # without the speculative info gauge beside the parallel one, speculation is off
    with Replay(trtllm_routes([[5]], gauges(100, 32) + config_gauges(None, reuse=True))) as srv:
        e = create("trtllm", "/m/tiny", "bfloat16", {"url": srv.url})
        off = await e.start()
        await e.stop()
    assert off.effective["speculative"] is False and off.effective["prefix_caching"] is True
    # an older server (no config info gauges): nothing about features is claimed
    with Replay(trtllm_routes([[5]], gauges(100, 32))) as srv:
        e = create("trtllm", "/m/tiny", "bfloat16", {"url": srv.url, "speculative_config": ngram})
        old = await e.start()
        await e.stop()
    assert "speculative" not in old.effective and "does not report" in old.unhonoured["speculative_config"]
