"""TGI adapter: command line, a real recorded stream and log (TGI 2.0.3), and facts recorded
from TGI's own source at v3.3.7 (fixtures/tgi/facts.json; SOURCE.md names each file).
Our own server's TGI routes are not used: its /info answers what TGI >= 2.3 does not."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.base import EngineUnavailable, GenerationRequest, SamplingConfig
from adapters.engines.tgi.settings import TGI, VERSIONS, max_batch_total_tokens
from adapters.registry import create
from adapters.transport.launcher import Launcher
from tests.adapters.adapter_util import check_stream, random_prompts, tokens
from tests.adapters.replay import Replay, facts, fixture

# What each tag's server reports as its version: Cargo.toml's workspace version at that tag
# (adapters/engines/tgi/upstream.json `tags`, read from Cargo.toml at each tag)
TAG_FACTS = json.loads((Path(__file__).parents[2] / "adapters/engines/tgi/upstream.json").read_text())["tags"]
TAG_REPORTS = {tag: fact["reports"] for tag, fact in TAG_FACTS.items()}
TAG_COMMITS = {tag: fact["commit"] for tag, fact in TAG_FACTS.items()}

FACTS = facts("tgi")

RECORDED_IDS = [13, 32072, 30499, 32611, 32246, 30329, 30449, 32126, 32001, 30412, 29973, 13, 33676, 32709,
                32119, 13, 35072, 30329, 32001, 30267]


def fake_venv(tmp_path, script: str):
    (tmp_path / "bin").mkdir()
    for name in ("python", script):
        (tmp_path / "bin" / name).write_text("")
    return Launcher.parse(str(tmp_path))


def test_server_argv(tmp_path):
    e = create("tgi", "/models/llama", "float32", {"launcher": str(tmp_path), "kv_cache_tokens": 8192,
                                                "max_concurrent_requests": 64})
    s = e.server
    s.launcher, s.port = fake_venv(tmp_path, "text-generation-launcher"), 8080
    argv = e.server_argv()
    assert argv == [
        str(tmp_path / "bin" / "text-generation-launcher"), "--model-id", "/models/llama", "--hostname", "127.0.0.1",
        "--port", "8080", "--dtype", "bfloat16", "--max-batch-total-tokens", "8192", "--max-concurrent-requests", "64"]
    assert {a for a in argv if a.startswith("--")} <= set(FACTS["launcher"]["flags"])  # launcher/src/main.rs @ v3.3.7
    e = create("tgi", "/models/llama", "float16", {})
    e.server.launcher, e.server.port = s.launcher, 8080
    assert e.server_argv()[7:9] == ["--dtype", "float16"]


def test_float32_runs_as_bfloat16_and_says_so():
    """Defect 3. facts: launcher.dtype_choices (launcher/src/main.rs @ v3.3.7: float16, bfloat16
    only) and default_dtype (without --dtype the model picks). A float32 config is launched
    with --dtype bfloat16, and EngineInfo carries what ran plus what was asked."""
    e = create("tgi", "/models/llama", "float32", {})
    ran = e.dtype_ran({})
    assert ran == "bfloat16" in FACTS["launcher"]["dtype_choices"]
    why = e.unhonoured(ran, None)["dtype"]
    assert "float32 was asked" in why and "bfloat16 ran" in why
    assert "ignore_eos" in e.unhonoured(ran, None)  # ignore_eos.request_field: none (validation.rs)


def test_no_in_process_mode():
    with pytest.raises(ValueError, match="mode must be one of server, attach"):
        create("tgi", "m", "float32", {"mode": "in_process"})


def test_kv_capacity_from_the_recorded_startup_log():
    assert max_batch_total_tokens(fixture("tgi", "launcher_2.0.3.log").decode()) == 15232
    assert max_batch_total_tokens("INFO text_generation_router: Connected") is None


async def test_recorded_stream():
    """TGI 2.0.3's real /generate_stream body (fixtures/tgi/SOURCE.md), through huggingface_hub."""
    stream = (200, "text/event-stream", fixture("tgi", "generate_stream_2.0.3.sse"))
    # built from the facts of the image the recorded server ran (2.0.3): /info `version` is Cargo.toml@v2.0.3's
    # "2.0.2" and `sha` the tag's commit (adapters/engines/tgi/upstream.json tags); the sha tells it from v2.0.2
    info_203 = (200, "application/json", json.dumps({"version": TAG_REPORTS["v2.0.3"], "sha": TAG_COMMITS["v2.0.3"]}).encode())
    with Replay({("POST", "/"): stream, ("POST", "/generate_stream"): stream, ("GET", "/info"): info_203}) as srv:
        e = create("tgi", "tokyotech-llm/Swallow-7b-hf", "float16", {"url": srv.url})
        info = await e.start()
        req = GenerationRequest("r1", [1, 2], SamplingConfig(max_tokens=20), prompt_text="日本で一番高い山はなんですか？")
        events = [ev async for ev in e.generate(req)]
        await e.stop()
    check_stream(events, "r1")
    assert tokens(events) == RECORDED_IDS
    assert "".join(ev.text for ev in events) == "\n日本で一番高い山はなんですか?\nベストアンサー\n富士山です。"
    assert events[-1].finish_reason is None  # the recorded request did not ask for details
    assert info.knobs["ignore_eos"] == "unsupported" and info.kv_capacity_tokens is None  # no capacity in that /info
    body = srv.posted("/")[0] if srv.posted("/") else srv.posted("/generate_stream")[0]
    assert body["inputs"] == "日本で一番高い山はなんですか？" and body["parameters"]["max_new_tokens"] == 20
    assert body["parameters"]["details"] is True and body["stream"] is True




@pytest.mark.parametrize("tag", sorted(TAG_REPORTS))
def test_each_tags_reported_version_maps_to_the_row_of_that_tag(tag):
    """Defect 1 of issue 38: v3.3.6 and v3.3.7 report "3.3.6-dev0" and v2.0.3 reports "2.0.2"; a
    string two tags share is taken when both are in one row, and else only with the image tag."""
    release, said = tag.removeprefix("v"), TAG_REPORTS[tag]
    want = next((r for r in VERSIONS.rows if r.covers(release)), None)
    if want is None:  # a neighbouring tag recorded for its string: never accepted by its string alone
        with pytest.raises(EngineUnavailable):
            VERSIONS.row(None, tag=release)
        return
    assert VERSIONS.row(None, tag=release) is want and VERSIONS.row(said, tag=release) is want
    sharing = [t for t, s2 in TAG_REPORTS.items() if s2 == said]
    if all(next((r for r in VERSIONS.rows if r.covers(t.removeprefix("v"))), None) is want for t in sharing):
        assert VERSIONS.row(said) is want
    else:  # e.g. "2.0.2": v2.0.2 (not in the table) reports it too
        with pytest.raises(EngineUnavailable, match="launch the container image by its release tag"):
            VERSIONS.row(said)


def test_the_build_commit_decides_between_releases_reporting_the_same_string():
    assert VERSIONS.row("2.0.2", VERSIONS.release_of(TAG_COMMITS["v2.0.3"])) is VERSIONS.row(None, tag="2.0.3")
    assert {VERSIONS.release_of(TAG_COMMITS[t]) for t in ("v3.3.6", "v3.3.7")} == {"3.3.6", "3.3.7"}
    assert VERSIONS.release_of(TAG_COMMITS["v3.3.5"]) is None  # its string alone names it


def test_a_version_string_no_release_reports_is_refused():
    with pytest.raises(EngineUnavailable, match="no release reports '3.3.7'"):
        VERSIONS.row("3.3.7")
    with pytest.raises(EngineUnavailable, match="image tag says 3.3.7"):
        VERSIONS.row("3.3.5", tag="3.3.7")


def info_v3(**extra) -> bytes:
    """/info as TGI v3.3.7 builds it (router/src/lib.rs struct Info: facts info.fields)."""
    body = {k: None for k in FACTS["info"]["fields"]}
    body.update(dict(model_id="tiny", router="text-generation-router", version=TAG_REPORTS["v3.3.7"],
                     max_concurrent_requests=128,
                     max_input_tokens=1024, max_total_tokens=2048), **extra)
    return json.dumps(body).encode()


def metrics_v3(capacity: int, reserved: int = 0, running: int = 0) -> bytes:
    """/metrics with TGI's gauge names (facts metrics.gauges, backends/v3/src @ v3.3.7)."""
    return (f"# TYPE tgi_batch_max_total_tokens gauge\ntgi_batch_max_total_tokens {capacity}\n"
            f"# TYPE tgi_batch_current_max_tokens gauge\ntgi_batch_current_max_tokens {reserved}\n"
            f"# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size {running}\n"
            f"# TYPE tgi_queue_size gauge\ntgi_queue_size 0\n").encode()


async def test_capacity_from_the_gauge_and_an_ignored_budget_is_not_called_pinned(tiny_llama):
    """Defect 3. facts: info (router/src/lib.rs @ v3.3.7: no max_batch_total_tokens since
    v2.3.0), kv_budget (backends/v3/src/lib.rs: --max-batch-total-tokens ignored for
    Flash-Attention models; the value used is the tgi_batch_max_total_tokens gauge).
    Before the fix the adapter read capacity from /info only, so it stayed unknown."""
    stream = (200, "text/event-stream", fixture("tgi", "generate_stream_2.0.3.sse"))
    routes = {("GET", "/info"): (200, "application/json", info_v3()),
              ("GET", "/metrics"): (200, "text/plain", metrics_v3(15232, reserved=3808, running=2)),
              ("POST", "/"): stream, ("POST", "/generate_stream"): stream}
    assert "max_batch_total_tokens" not in json.loads(info_v3())
    with Replay(routes) as srv:
        e = create("tgi", str(tiny_llama), "float32", {"url": srv.url, "kv_cache_tokens": 8192})
        info = await e.start()
        snap = await e.snapshot()
        ids = random_prompts(tiny_llama, 1, seed=3)[0]
        events = [ev async for ev in e.generate(GenerationRequest("r", ids, SamplingConfig(max_tokens=20)))]
        await e.stop()
    assert info.kv_capacity_tokens == 15232 and info.metrics_url == srv.url + TGI.path
    assert "8192" in info.unhonoured["kv_cache_tokens"] and "15232" in info.unhonoured["kv_cache_tokens"]
    assert info.dtype == "unknown" and "not reported" in info.unhonoured["dtype"]  # attached, /info has no dtype
    assert (snap.kv_capacity_tokens, snap.kv_used_tokens, snap.num_running, snap.num_waiting) == (15232, 3808, 2, 0)
    assert round(snap.kv_usage, 4) == 0.25
    check_stream(events, "r")
    body = srv.posted("/")[0] if srv.posted("/") else srv.posted("/generate_stream")[0]
    from tokenizers import Tokenizer  # no prompt_text: the adapter decoded the ids with the model's tokenizer
    assert body["inputs"] == Tokenizer.from_file(str(tiny_llama / "tokenizer.json")).decode(ids, skip_special_tokens=False)


async def test_tgi_before_2_3_reports_capacity_and_dtype_in_info():
    """facts: info.fields_before_2_3_0 (router/src/lib.rs @ v2.2.0)."""
    stream = (200, "text/event-stream", fixture("tgi", "generate_stream_2.0.3.sse"))
    routes = {("GET", "/info"): (200, "application/json", info_v3(
        max_batch_total_tokens=15232, version=TAG_REPORTS["v2.0.3"], sha=TAG_COMMITS["v2.0.3"],
        model_dtype="torch.float16")),
              ("POST", "/"): stream, ("POST", "/generate_stream"): stream}
    with Replay(routes) as srv:
        e = create("tgi", "m", "float16", {"url": srv.url})
        info = await e.start()
        await e.stop()
    assert (info.kv_capacity_tokens, info.dtype, info.metrics_url) == (15232, "float16", None)
    assert set(info.unhonoured) == {"ignore_eos"}
    assert (info.effective["dtype"], info.effective["sources"]["dtype"]) == ("float16", "/info model_dtype (TGI < 2.3)")


def test_metric_table_uses_recorded_names():
    """facts: metrics (router/src/server.rs, backends/v3/src @ v3.3.7)."""
    m = FACTS["metrics"]
    assert set(TGI.histograms().values()) <= set(m["histograms"])
    assert {n.removesuffix("_sum") for alts in TGI.counters().values() for n in alts} <= set(m["histograms"])
    assert {*TGI.running, *TGI.waiting, *TGI.kv_capacity, *TGI.kv_used} <= set(m["gauges"])
    assert TGI.ttft is None and TGI.tpot is None  # no TTFT histogram; mean time per token is not TPOT


def test_features_become_the_launchers_flag_and_env(tmp_path):
    """facts: launcher.flags (--speculate), prefix_caching.env (PREFIX_CACHING, "1"/"true" on),
    speculation (no draft-model speculation; n-gram is a one-token match)."""
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    e = create("tgi", "/models/llama", "float16", {"launcher": str(tmp_path), "enable_prefix_caching": False,
                                                "speculative_config": ngram})
    e.server.launcher, e.server.port = fake_venv(tmp_path, "text-generation-launcher"), 8080
    argv = e.server_argv()
    assert argv[-2:] == ["--speculate", "3"] and set(a for a in argv if a.startswith("--")) <= set(
        FACTS["launcher"]["flags"])
    env = e.server_env(None)
    assert env["PREFIX_CACHING"] == "0" and FACTS["prefix_caching"]["env"] == "PREFIX_CACHING"
    assert "1" in FACTS["prefix_caching"]["env_true"]
    assert "one-token match" in e.unhonoured("float16", None)["speculative_config.prompt_lookup"]
    draft = create("tgi", "/models/llama", "float16", {"launcher": str(tmp_path), "speculative_config": {
        "method": "draft_model", "num_speculative_tokens": 3, "model": "/d"}})
    draft.server.launcher, draft.server.port = e.server.launcher, 8080
    assert "--speculate" not in draft.server_argv() and FACTS["speculation"]["draft_model"] is None
    assert "no draft-model speculation" in draft.unhonoured("float16", None)["speculative_config"]
    assert set(create("tgi", "/m", "float16", {"launcher": str(tmp_path)}).server_env(None)) == {"PROMETHEUS_PORT"}


def built_launch_log(speculate: int | None, prefix: bool) -> str:
    """A TGI launch log built from the line formats of facts.log_lines / prefix_caching / speculation
    (v3.3.7 source; values made up) around the real 2.0.3 router lines (launcher_2.0.3.log)."""
    lines = ["2025-01-01T00:00:00Z  INFO text_generation_launcher: Args {\n    model_id: \"/m\",\n    dtype: Some(\n"
             "        BFloat16,\n    ),\n    speculate: " + (f"Some(\n        {speculate},\n    )" if speculate else
                                                          "None") + ",\n}",
             f"2025-01-01T00:00:01Z  INFO text_generation_launcher: Using attention flashinfer - Prefix caching "
             f"{'true' if prefix else '0'}",
             f"2025-01-01T00:00:02Z  INFO text_generation_launcher: Using prefix caching = {prefix}"]
    if speculate:
        lines.append(f"2025-01-01T00:00:03Z  INFO text_generation_launcher: Using speculation n-gram with "
                     f"{speculate} input ids.")
    lines.append("2025-01-01T00:00:04Z  INFO text_generation_launcher: KV-cache blocks: 15232, size: 1")
    return "\n".join(lines) + "\n" + fixture("tgi", "launcher_2.0.3.log").decode()


def test_launch_log_read_back():
    from adapters.common.readback import ReadBack
    from adapters.engines.tgi.settings import log_read_back

    rb = ReadBack()
    log_read_back(rb, built_launch_log(3, True), "log")
    assert rb.effective == {"dtype": "bfloat16", "prefix_caching": True, "kv_blocks": 15232, "block_size": 1,
                            "cuda_graphs": True, "kv_capacity_tokens": 15232,
                            "speculative": {"method": "ngram", "num_speculative_tokens": 3},
                            "tensor_parallel_size": 1}  # no "Sharding model on N processes" line: one shard
    rb = ReadBack()
    log_read_back(rb, built_launch_log(None, False), "log")
    assert rb.effective["speculative"] is False and rb.effective["prefix_caching"] is False
    rb = ReadBack()  # the real 2.0.3 router lines alone: CUDA graphs and the capacity, nothing else
    log_read_back(rb, fixture("tgi", "launcher_2.0.3.log").decode(), "log")
    assert rb.effective == {"cuda_graphs": True, "kv_capacity_tokens": 15232, "speculative": False,
                            "tensor_parallel_size": 1}


async def test_attached_server_cannot_take_features_and_info_gives_the_context():
    stream = (200, "text/event-stream", fixture("tgi", "generate_stream_2.0.3.sse"))
    routes = {("GET", "/info"): (200, "application/json", info_v3()),
              ("GET", "/metrics"): (200, "text/plain", metrics_v3(15232)),
              ("POST", "/"): stream, ("POST", "/generate_stream"): stream}
    with Replay(routes) as srv:
        e = create("tgi", "m", "float16", {"url": srv.url, "enable_prefix_caching": True})
        info = await e.start()
        await e.stop()
    assert "fixed when it started" in info.unhonoured["enable_prefix_caching"]
    assert info.effective["max_model_len"] == 2048 and info.effective["kv_capacity_tokens"] == 15232
    assert info.memory == {} and "launch_command" not in info.effective  # TGI reports no memory split


def test_no_adapter_test_speaks_to_our_tgi_imitation():
    """Our server's TGI routes answer /info with fields TGI >= 2.3 no longer has: a TGI adapter
    test against them would prove nothing about TGI. No test module here that imports the TGI
    adapter imports a way to start our server (tests.adapters.own_server, reference_engine.server,
    experiments.cli), so TGI is only met through its recorded responses and source facts."""
    import ast
    from pathlib import Path

    ours = ("tests.adapters.own_server", "reference_engine.server", "experiments.cli", "adapters.engines.reference.server")
    checked = []
    for f in sorted(Path(__file__).parent.glob("test_*.py")):
        imported = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
        if any(m.startswith("adapters.engines.tgi") for m in imported):
            checked.append(f.name)
            assert not {m for m in imported if m.startswith(ours)}, (f.name, imported)
    assert checked == ["test_parallel.py", "test_tgi.py", "test_versions.py"]


def test_max_model_len_gets_total_and_input_tokens_and_reads_them_back(tmp_path):
    """Issue 27: the harness's one length is TGI's --max-total-tokens (input one less), read back from /info."""
    e = create("tgi", "/models/llama", "bfloat16", {"launcher": str(tmp_path), "max_model_len": 384})
    e.server.launcher, e.server.port = fake_venv(tmp_path, "text-generation-launcher"), 8080
    argv = e.server_argv()
    i, j = argv.index("--max-total-tokens"), argv.index("--max-input-tokens")
    assert (argv[i + 1], argv[j + 1]) == ("384", "383")
    assert {a for a in argv if a.startswith("--")} <= set(FACTS["launcher"]["flags"])
    assert e.read_back({"max_total_tokens": 384}, None)[0]["max_model_len"] == 384  # /info
    with pytest.raises(ValueError, match="either it or them"):
        create("tgi", "/models/llama", "bfloat16", {"launcher": str(tmp_path), "max_model_len": 384, "max_total_tokens": 9})


def test_launched_dtype_row_is_labelled_as_requested():
    """The launcher's Args print echoes the --dtype it was given (launcher/src/main.rs @ v3.3.7):
    not a report of what the shard loaded."""
    from adapters.common.readback import ReadBack
    from adapters.engines.tgi.settings import log_read_back

    rb = ReadBack()
    log_read_back(rb, built_launch_log(None, True), "log")
    assert rb.sources["dtype"] == ("as requested — the engine does not report it (log: the launcher's Args print, "
                                   "the --dtype it was given)")


def test_each_launch_gets_its_own_prometheus_port(tmp_path):
    """TGI's router binds a Prometheus port (9000 by default): two servers on --network host
    would collide, so each launch asks for a free one through the launcher's environment."""
    a = create("tgi", "/m", "float16", {"launcher": str(tmp_path)})
    b = create("tgi", "/m", "float16", {"launcher": str(tmp_path)})
    pa, pb = int(a.server_env(None)["PROMETHEUS_PORT"]), int(b.server_env(None)["PROMETHEUS_PORT"])
    assert pa != pb and 9000 not in (pa, pb) and a.server_env(None)["PROMETHEUS_PORT"] == str(pa)


async def test_a_version_outside_the_table_is_refused():
    with Replay({("GET", "/info"): (200, "application/json", info_v3(version="3.2.3"))}) as srv:
        e = create("tgi", "m", "float16", {"url": srv.url})
        with pytest.raises(EngineUnavailable) as err:
            await e.start()
    assert str(err.value) == ("tgi 3.2.3 is not in the adapter's version table (known: 2.0.3, 3.3.0-3.3.7; "
                              "adapters/engines/tgi/)")


def test_version_found_before_launch_from_the_launcher_or_the_image_tag(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    fake_venv(venv, "text-generation-launcher")
    script = venv / "bin" / "text-generation-launcher"
    script.write_text("#!/bin/sh\necho text-generation-launcher 3.2.3\n")
    script.chmod(0o755)
    e = create("tgi", "/m", "float16", {"launcher": str(venv)})
    e.server.launcher, e.server.port = Launcher.parse(str(venv)), 8080
    assert e.launcher_version() == "3.2.3"
    with pytest.raises(EngineUnavailable, match="^tgi 3.2.3 is not in the adapter's version table"):
        e.server_argv()
    from adapters.common.versions import image_tag_version
    assert image_tag_version(["docker", "run", "ghcr.io/huggingface/text-generation-inference:3.3.7"]) == "3.3.7"
    assert image_tag_version(["docker", "run", "lmsysorg/sglang:v0.5.23-cu129"]) == "0.5.23"
    assert image_tag_version(["docker", "run", "lmsysorg/sglang:latest"]) is None
    assert image_tag_version(["docker", "run", "localhost:5000/sglang"]) is None
