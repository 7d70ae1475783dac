"""SGLang adapter: command line, real /server_info and /generate responses replayed, diffing."""
from __future__ import annotations

import asyncio
import json
import sys
import types

import pytest

from adapters.base import EngineUnavailable, GenerationRequest, RequestError, SamplingConfig
from adapters.registry import create
from adapters.transport.launcher import Launcher
from tests.adapters.replay import Replay, fixture
from tests.adapters.test_vllm import fake_package

RECORDED = json.loads(fixture("sglang", "generate_response.json"))
RECORDED_DEV_BUILD = "0.0.0.dev1+g54b06f199"  # what the recorded /server_info says it runs


def recorded_info(version: str = "0.5.23") -> bytes:
    """The recorded /server_info with `version` set: the recorded server is a main-branch dev
    build, which no row of the version table covers (see test_a_version_outside_the_table_is_refused)."""
    info = json.loads(fixture("sglang", "server_info.json"))
    assert info["version"] == RECORDED_DEV_BUILD
    return json.dumps({**info, "version": version}).encode()


def installed_version(tmp_path, monkeypatch, version: str) -> None:
    """A fake `sglang` package with distribution metadata of `version`, seen by child interpreters."""
    fake_package(tmp_path, monkeypatch, "sglang")
    meta = tmp_path / "site" / f"sglang-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")


def built_stream(ids: list[int], meta: dict, cumulative: bool = True) -> bytes:
    """An SSE body framed as SGLang's http_server.py frames /generate (fixtures/sglang/SOURCE.md:
    built from the recorded final response, not itself recorded)."""
    events = []
    for i in range(1, len(ids) + 1):
        m = dict(meta) if i == len(ids) else {**meta, "finish_reason": None, "completion_tokens": i}
        out = ids[:i] if cumulative else ids[i - 1:i]
        events.append(b"data: " + json.dumps({"text": "", "output_ids": out, "meta_info": m}).encode() + b"\n\n")
    return b"".join(events) + b"data: [DONE]\n\n"


def routes(stream: bytes, server_info: bytes | None = None) -> dict:
    return {("GET", "/server_info"): (200, "application/json", server_info or recorded_info()),
            ("POST", "/generate"): (200, "text/event-stream", stream),
            ("POST", "/flush_cache"): (200, "text/plain", b"Cache flushed.\n"),
            ("POST", "/abort_request"): (200, "application/json", b"{}")}


def test_server_argv(tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, "sglang")
    e = create("sglang", "/m/qwen", "bfloat16", {"launcher": sys.executable, "kv_cache_tokens": 4096,
                                             "mem_fraction_static": 0.8, "disable_radix_cache": True})
    s = e.server
    s.launcher, s.port = Launcher.parse(sys.executable), 30000
    assert e.server_argv() == [
        sys.executable, "-m", "sglang.launch_server", "--model-path", "/m/qwen", "--host", "127.0.0.1", "--port",
        "30000", "--dtype", "bfloat16", "--enable-metrics", "--log-level", "warning", "--mem-fraction-static", "0.8",
        "--disable-radix-cache", "--max-total-tokens", "4096"]


async def test_recorded_server_info_and_stream():
    ids, meta = RECORDED["output_ids"], RECORDED["meta_info"]
    with Replay(routes(built_stream(ids, meta))) as srv:
        e = create("sglang", "qwen/qwen2.5-0.5b-instruct", "float32", {"url": srv.url})
        info = await e.start()
        req = GenerationRequest("r1", [1, 2, 3, 4, 5, 6, 7], SamplingConfig(max_tokens=128, ignore_eos=True))
        events = [ev async for ev in e.generate(req)]
        assert await e.reset_prefix_cache() is True
        await e.stop()
    assert (info.kv_capacity_tokens, info.block_size, info.mode) == (20480, 1, "attach")
    assert info.version == "0.5.23" and info.knobs["incremental_streaming_output"] is False
    assert info.unhonoured == {} and info.metrics_url is None  # the recorded server ran without --enable-metrics
    assert [t for ev in events for t in ev.token_ids] == ids and all(len(ev.token_ids) == 1 for ev in events)
    assert [ev.finished for ev in events].count(True) == 1 and events[-1].finished
    assert (events[-1].finish_reason, events[-1].prompt_tokens, events[-1].completion_tokens) == ("length", 7, 128)
    body = srv.posted("/generate")[0]
    assert body["input_ids"] == [1, 2, 3, 4, 5, 6, 7] and body["stream"] is True and body["rid"] == "r1"
    assert body["sampling_params"] == {"max_new_tokens": 128, "temperature": 0.0, "top_p": 1.0, "ignore_eos": True}


async def test_incremental_server_is_not_diffed():
    ids, meta = RECORDED["output_ids"][:6], {**RECORDED["meta_info"], "completion_tokens": 6}
    info = json.loads(recorded_info())
    info["incremental_streaming_output"] = True  # as a server started with --incremental-streaming-output says
    with Replay(routes(built_stream(ids, meta, cumulative=False), json.dumps(info).encode())) as srv:
        e = create("sglang", "m", "float32", {"url": srv.url})
        await e.start()
        events = [ev async for ev in e.generate(GenerationRequest("r", [1], SamplingConfig(max_tokens=6)))]
        await e.stop()
    assert [t for ev in events for t in ev.token_ids] == ids


async def test_incremental_stream_read_as_cumulative_is_a_request_error():
    ids, meta = RECORDED["output_ids"][:4], RECORDED["meta_info"]
    with Replay(routes(built_stream(ids, meta, cumulative=False))) as srv:
        e = create("sglang", "m", "float32", {"url": srv.url})
        await e.start()
        with pytest.raises(RequestError, match="incrementally"):
            [ev async for ev in e.generate(GenerationRequest("r", [1], SamplingConfig(max_tokens=4)))]
        await e.stop()


async def test_missing_sglang_is_engine_unavailable(tmp_path):
    e = create("sglang", "m", "float32", {"launcher": sys.executable, "work_dir": str(tmp_path)})
    with pytest.raises(EngineUnavailable, match="'sglang' is not installed.*sglang\\[all\\]"):
        await e.start()
    with pytest.raises(EngineUnavailable, match="sglang"):
        await create("sglang", "m", "float32", {"mode": "in_process"}).start()


def test_bad_options():
    with pytest.raises(ValueError, match="unknown option"):
        create("sglang", "m", "float32", {"mem_fraction": 0.5})


@pytest.mark.parametrize("version, flags", [
    ("0.5.23", ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]),
    ("0.5.14", ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]),
    ("0.5.13", ["--disable-cuda-graph"]),
    ("0.5.9", ["--disable-cuda-graph"])])
def test_disable_cuda_graph_flags_follow_the_installed_version(tmp_path, monkeypatch, version, flags):
    """The argument-groups refactor brought --cuda-graph-backend-* in 0.5.14 (0.5.23 calls
    --disable-cuda-graph deprecated); before, only --disable-cuda-graph exists (both checked
    against each version's parser by test_sglang_contract.py). The version is the one the
    launcher's interpreter has installed."""
    installed_version(tmp_path, monkeypatch, version)
    e = create("sglang", "/m", "float16", {"launcher": sys.executable, "disable_cuda_graph": True})
    e.server.launcher = Launcher.parse(sys.executable)
    assert e.flags() == flags and e.row.covers(version)


def test_an_installed_version_outside_the_table_is_refused_before_launch(tmp_path, monkeypatch):
    installed_version(tmp_path, monkeypatch, "0.4.10")
    e = create("sglang", "/m", "float16", {"launcher": sys.executable, "disable_cuda_graph": True})
    e.server.launcher = Launcher.parse(sys.executable)
    with pytest.raises(EngineUnavailable, match=r"^sglang 0\.4\.10 is not in the adapter's version table "
                                                r"\(known: 0\.5\.9-0\.5\.12, 0\.5\.13, 0\.5\.14-0\.5\.21, 0\.5\.22-0\.5\.23;"):
        e.flags()


async def test_a_version_outside_the_table_is_refused():
    """The recorded server is a main-branch dev build: what it runs cannot be told from its number."""
    with Replay(routes(b"", recorded_info(RECORDED_DEV_BUILD))) as srv:
        e = create("sglang", "m", "float32", {"url": srv.url})
        with pytest.raises(EngineUnavailable) as err:
            await e.start()
    assert str(err.value).startswith(f"sglang {RECORDED_DEV_BUILD} is not in the adapter's version table (known:")
    assert "\n" not in str(err.value)


async def test_a_server_whose_version_needs_other_flags_than_launched_is_refused(tmp_path, monkeypatch):
    """Launched with the newest row's flags (version not found before launch), the server says 0.5.9."""
    fake_package(tmp_path, monkeypatch, "sglang")
    e = create("sglang", "/m", "float16", {"launcher": sys.executable, "disable_cuda_graph": True})
    e.server.launcher = Launcher.parse(sys.executable)
    assert "--cuda-graph-backend-decode" in e.flags()
    with pytest.raises(EngineUnavailable, match="was launched with the flags of 0.5.22-0.5.23"):
        e._check_version({"version": "0.5.9"})


async def test_attached_budget_that_is_not_the_capacity_is_reported():
    """fixtures/sglang/SOURCE.md: --max-total-tokens is an upper bound (min with what fits,
    mem_cache/kv_cache_configurator.py in sglang 0.5.23); the recorded server runs 20480."""
    ids, meta = RECORDED["output_ids"], RECORDED["meta_info"]
    with Replay(routes(built_stream(ids, meta))) as srv:
        e = create("sglang", "m", "float32", {"url": srv.url, "kv_cache_tokens": 4096})
        info = await e.start()
        await e.stop()
    assert "4096" in info.unhonoured["kv_cache_tokens"] and "20480" in info.unhonoured["kv_cache_tokens"]
    assert info.dtype == "float32" and "dtype" not in info.unhonoured  # the recorded server says "auto"
    assert info.effective["dtype"] == "float32" and info.effective["sources"]["dtype"].startswith(
        "as requested — the engine does not report it")


def rank_metrics(usages: list[float], used: list[int], cap: int) -> bytes:
    """SGLang's scheduler gauges (metrics_collector.py, sglang 0.5.23), one label set per DP rank."""
    out = []
    for name, vals in (("sglang:token_usage", usages), ("sglang:num_used_tokens", used),
                       ("sglang:num_running_reqs", [1] * len(usages)), ("sglang:num_queue_reqs", [0] * len(usages)),
                       ("sglang:max_total_num_tokens", [cap] * len(usages))):
        out.append(f"# TYPE {name} gauge")
        out += [f'{name}{{model_name="m",dp_rank="{r}",tp_rank="0"}} {v}' for r, v in enumerate(vals)]
    return ("\n".join(out) + "\n").encode()


async def test_kv_usage_is_averaged_over_data_parallel_ranks():
    """Defect 6: two DP ranks each half full are half full, not 100 % (prom.value summed them)."""
    r = routes(built_stream(RECORDED["output_ids"][:2], RECORDED["meta_info"]))
    r[("GET", "/metrics")] = (200, "text/plain", rank_metrics([0.5, 0.5], [5120, 5120], 10240))
    with Replay(r) as srv:
        e = create("sglang", "m", "float32", {"url": srv.url})
        info = await e.start()
        snap = await e.snapshot()
        await e.stop()
    assert snap.kv_usage == 0.5  # the sum said 1.0
    assert (snap.kv_used_tokens, snap.num_running, snap.num_waiting) == (10240, 2, 0)
    assert info.metrics_url == srv.url + "/metrics"


class _FlushResult:
    """FlushCacheReqOutput (managers/io_struct.py, sglang 0.5.23): an object with `success`."""

    def __init__(self, success: bool):
        self.success = success


class _TokenizerManager:
    def __init__(self, flushed: bool):
        self.flushed = flushed
        self.server_args = types.SimpleNamespace(page_size=16, dtype="bfloat16")

    async def flush_cache(self, timeout_s=None):
        return _FlushResult(self.flushed)

    async def get_internal_state(self):
        return [{}]


class _Engine:
    """sglang.Engine as entrypoints/engine.py (0.5.23) builds it: `self.loop` is the running
    loop when constructed inside one (`_ensure_event_loop`), and `get_server_info()` /
    `flush_cache()` call `self.loop.run_until_complete(...)` on it. Facts recorded in
    fixtures/sglang/SOURCE.md; the contract test checks them in SGLang's installed source."""

    flushed = True

    def __init__(self, **kw):
        self.kw = kw
        self.loop = asyncio.get_running_loop()
        self.tokenizer_manager = _TokenizerManager(self.flushed)
        self._scheduler_init_result = types.SimpleNamespace(
            scheduler_infos=[{"max_total_num_tokens": 2048, "max_req_input_len": 2040}])

    def get_server_info(self):
        internal = self.loop.run_until_complete(self.tokenizer_manager.get_internal_state())
        return {"page_size": 16, "max_total_num_tokens": 2048, "internal_states": internal}

    def flush_cache(self):
        return self.loop.run_until_complete(self.tokenizer_manager.flush_cache())

    def shutdown(self):
        pass


@pytest.mark.parametrize("flushed", [True, False])
async def test_in_process_starts_inside_a_running_loop_and_reads_flush_success(monkeypatch, flushed):
    """Defect 4: start() called get_server_info() (run_until_complete on the running loop:
    RuntimeError) and reset_prefix_cache() returned bool(flush_cache()), always True."""
    monkeypatch.setitem(sys.modules, "sglang", types.SimpleNamespace(Engine=type("E", (_Engine,), {"flushed": flushed}),
                                                                     __version__="0.5.23"))
    e = create("sglang", "/m", "bfloat16", {"mode": "in_process", "kv_cache_tokens": 2048})
    info = await e.start()
    assert (info.kv_capacity_tokens, info.block_size, info.dtype, info.unhonoured) == (2048, 16, "bfloat16", {})
    assert e.engine.kw["max_total_tokens"] == 2048
    assert await e.reset_prefix_cache() is flushed
    await e.stop()


def argv_of(options: dict, tmp_path, monkeypatch) -> list[str]:
    if not (tmp_path / "site" / "sglang").exists():
        fake_package(tmp_path, monkeypatch, "sglang")
    e = create("sglang", "/m/qwen", "bfloat16", {"launcher": sys.executable, **options})
    e.server.launcher, e.server.port = Launcher.parse(sys.executable), 30000
    return e.server_argv()


def test_feature_flags(tmp_path, monkeypatch):
    """What each uniform feature becomes (its meaning is checked with SGLang's own parser in
    test_sglang_contract.py)."""
    ngram = argv_of({"enable_prefix_caching": False, "disable_radix_cache": True,
                     "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}, tmp_path, monkeypatch)
    assert ngram.count("--disable-radix-cache") == 1  # the same switch twice renders once
    assert ngram[ngram.index("--speculative-algorithm"):] == [
        "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4",
        "--speculative-ngram-max-bfs-breadth", "1"]
    draft = argv_of({"enable_prefix_caching": True, "speculative_config": {"model": "/d", "num_speculative_tokens": 2}},
                    tmp_path, monkeypatch)
    assert "--disable-radix-cache" not in draft
    assert draft[draft.index("--speculative-algorithm"):] == [
        "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", "/d", "--speculative-num-steps",
        "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
    with pytest.raises(ValueError, match="contradict"):
        create("sglang", "m", "float32", {"enable_prefix_caching": True, "disable_radix_cache": True})


def server_info_0_5_23() -> dict:
    """The recorded /server_info (fixtures/sglang/server_info.json, a trimmed real answer) with the
    keys read_back reads that the trimmed file lacks, shaped as sglang 0.5.23 builds them
    (ServerArgs fields, internal_state.py, memory_usage.py: GiB): values made up."""
    info = json.loads(recorded_info())
    info.update(dtype="bfloat16", max_running_requests=None, chunked_prefill_size=8192, context_length=32768,
                disable_radix_cache=False, cuda_graph_backend_decode=None, enable_torch_compile=False,
                disable_cuda_graph=False, cuda_graph_config={"decode": {"backend": "full", "max_bs": 48},
                                                             "prefill": {"backend": "disabled"}},
                speculative_algorithm="NGRAM", speculative_num_steps=4, speculative_eagle_topk=1,
                speculative_num_draft_tokens=4, speculative_draft_model_path=None, tp_size=1,
                internal_states=[{"effective_max_running_requests_per_dp": 48,
                                  "memory_usage": {"weight": 0.934, "kvcache": 0.234, "startup_available": 70.1,
                                                   "token_capacity": 20480, "token_capacity_swa": None,
                                                   "graph": {"decode": 0.125, "prefill": 0.25}}}])
    return info


def test_read_back_from_server_info():
    from adapters.engines.sglang.settings import read_back

    effective, memory = read_back(server_info_0_5_23(), ["python", "-m", "sglang.launch_server"])
    sources = effective.pop("sources")
    assert effective == {
        "dtype": "bfloat16", "kv_capacity_tokens": 20480, "block_size": 1, "max_num_seqs": 48,
        "chunked_prefill": True, "max_num_batched_tokens": 8192, "max_model_len": 32768, "prefix_caching": True,
        "cuda_graphs": True, "compile": False, "tensor_parallel_size": 1,
        "speculative": {"method": "ngram", "num_speculative_tokens": 3, "sglang": {
            "speculative_algorithm": "NGRAM", "speculative_num_steps": 4, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4, "speculative_draft_model_path": None}},
        "launch_command": "python -m sglang.launch_server"}
    gib = 1 << 30
    assert memory == {"weights": round(0.934 * gib), "kv_allocated": round(0.234 * gib),
                      "graph_pool": round(0.375 * gib)}
    assert sources["max_num_seqs"].endswith("effective_max_running_requests_per_dp")
    assert "0.001 resolution" in sources["memory.weights"]
    # the recorded (trimmed) answer alone: what it has, nothing invented
    effective, memory = read_back(json.loads(fixture("sglang", "server_info.json")))
    # max_req_input_len (20474) is the input limit, not the context length: not read
    assert {k for k in effective if k != "sources"} == {"kv_capacity_tokens", "block_size"} and memory == {}
    assert sources["dtype"] == "as requested — the engine does not report it (/server_info `dtype` is the argument " \
                               "SGLang was given, not the dtype it loaded)"


@pytest.mark.parametrize("info, graphs", [
    # 0.5.23 resolves graphs off in a hook although the user field asked "full": the resolved value wins
    ({"cuda_graph_backend_decode": "full", "cuda_graph_config": {"decode": {"backend": "disabled"}}}, False),
    ({"cuda_graph_backend_decode": None, "disable_cuda_graph": False,
      "cuda_graph_config": {"decode": {"backend": "breakable"}}}, True),
    ({"disable_cuda_graph": True}, False),  # before the refactor (0.5.9-0.5.13): no cuda_graph_backend_decode
    ({"disable_cuda_graph": False, "cuda_graph_backend_decode": "disabled"}, None),  # user input only: not read
])
def test_cuda_graphs_are_read_from_the_resolved_config(info, graphs):
    from adapters.engines.sglang.settings import read_back

    effective, _ = read_back(info)
    assert effective.get("cuda_graphs") is graphs


async def test_attached_server_features_are_compared_and_ngram_window_is_unhonoured():
    info = server_info_0_5_23()
    info["disable_radix_cache"] = True
    ids, meta = RECORDED["output_ids"][:4], {**RECORDED["meta_info"], "completion_tokens": 4}
    with Replay(routes(built_stream(ids, meta), json.dumps(info).encode())) as srv:
        e = create("sglang", "m", "bfloat16", {"url": srv.url, "enable_prefix_caching": True, "speculative_config": {
            "method": "ngram", "num_speculative_tokens": 3}})
        got = await e.start()
        await e.stop()
    assert "reports false" in got.unhonoured["enable_prefix_caching"]  # the server runs without its radix cache
    assert "speculative_config" not in got.unhonoured  # NGRAM with 3 drafts, as asked
    assert "prompt_lookup" in got.unhonoured["speculative_config.prompt_lookup"]
    assert got.effective["speculative"]["num_speculative_tokens"] == 3 and got.memory["kv_allocated"] > 0


def test_seeded_sampling_is_read_back_and_a_seeded_sampled_run_without_it_is_flagged():
    """Issue 38, defect 5: SGLang builds its per-request seed tensor only with
    --enable-deterministic-inference (srt/sampling/sampling_batch_info.py, 0.5.23); otherwise a seeded
    sampled workload runs unseeded. The option passes the flag (parsed by SGLang's own parser in
    test_exp_dry_run.py); the setting is read back from /server_info and the report flags the run."""
    from types import SimpleNamespace

    from adapters.engines.sglang.settings import read_back
    from experiments.report import sections

    on = create("sglang", "/m", "bfloat16", {"launcher": "docker run --gpus all lmsysorg/sglang:v0.5.23-cu130",
                                         "enable_deterministic_inference": True})
    assert "--enable-deterministic-inference" in on.flags()
    off, _ = read_back({"enable_deterministic_inference": False, "dtype": "bfloat16"})
    assert off["seeded_sampling"] is False and "sampling_batch_info.py" in off["sources"]["seeded_sampling"]
    assert read_back({"enable_deterministic_inference": True})[0]["seeded_sampling"] is True

    def flags(temperature: float, seed: int | None, effective: dict) -> list[str]:
        run = SimpleNamespace(label="sglang", run_dir="d", summary={}, manifest={"info": {"effective": effective}})
        runs = SimpleNamespace(engines=[run], configs=[("d", {"sampling": {"temperature": temperature,
                                                                          "seed": seed}}, None)])
        return [f for f in sections.flags(runs) if "sampling seed" in f]

    assert len(flags(0.8, 7, off)) == 1 and "ignored the sampling seed" in flags(0.8, 7, off)[0]
    assert flags(0.0, 7, off) == [] and flags(0.8, None, off) == []  # greedy, or no seed: nothing to honour
    assert flags(0.8, 7, read_back({"enable_deterministic_inference": True})[0]) == []
