"""Bad input, keys, disconnects, a full queue and SIGTERM: 4xx (never 5xx), blocks freed, server alive."""
from __future__ import annotations

import asyncio
import random
import signal
import time

import httpx
import pytest

LONG = {"prompt": "Tell me a long story.", "max_tokens": 200, "temperature": 0, "ignore_eos": True}

BAD_COMPLETIONS = [
    (b'{"prompt": "hi", "max_tokens": 3', "malformed JSON"),
    (b'["prompt"]', None),
    (b'{"prompt": 5}', "prompt"),
    (b'{"prompt": "hi", "max_tokens": "many"}', "max_tokens"),
    (b'{"prompt": "hi", "max_tokens": 0}', "max_tokens"),
    (b'{"prompt": "hi", "max_tokens": -3}', "max_tokens"),
    (b'{"prompt": "hi", "max_tokens": 100000}', "context length"),
    (b'{"prompt": ""}', "empty"),
    (b'{"prompt": []}', "empty"),
    (b'{"prompt": [[]]}', "empty"),
    (b'{"prompt": [1, 99999999]}', "vocabulary"),
    (b'{"prompt": [-1]}', "vocabulary"),
    (b'{"prompt": "hi", "temperature": NaN}', "temperature"),
    (b'{"prompt": "hi", "temperature": -1}', "temperature"),
    (b'{"prompt": "hi", "top_p": 0}', "top_p"),
    (b'{"prompt": "hi", "logprobs": 99}', "logprobs"),
    (b'{"prompt": "hi", "n": 0}', "n"),
    (b'{"prompt": "hi", "n": 100000}', "n"),
    (b'{"prompt": "hi", "seed": 1e400}', None),
    (b'{"prompt": "hi", "seed": 99999999999999999999999}', "seed"),
    (b'{"prompt": "hi", "stop": [""]}', "stop"),
    (b'{"prompt": "hi", "echo": true}', "echo"),
    (b'{"prompt": "hi", "stream": true, "max_tokens": 0}', "max_tokens"),
]
BAD_CHAT = [
    (b'{"messages": []}', "messages"),
    (b'{"messages": "hello"}', "messages"),
    (b'{"messages": [{"content": "no role"}]}', "role"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "text"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}', "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 100000}', "context"),
]


@pytest.mark.parametrize("path,body,words", [("/v1/completions", b, w) for b, w in BAD_COMPLETIONS]
                         + [("/v1/chat/completions", b, w) for b, w in BAD_CHAT])
def test_bad_input_is_400_with_openai_error(server, path, body, words):
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    if words:
        assert words in err["message"] or words == err["param"], err


def test_unknown_routes_and_methods_use_error_bodies(server):
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(server.url + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.slow  # starts a private server
def test_api_key(launch):
    s = launch(api_key="sekret")
    body = {"prompt": "hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
        r = httpx.post(s.url + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(s.url + "/generate", json={"inputs": "hi"})
    assert r.status_code == 401 and r.json()["error_type"] == "authentication"
    assert httpx.post(s.url + "/v1/completions", json=body, headers=s.headers).status_code == 200
    assert httpx.get(s.url + "/health").status_code == 200 and httpx.get(s.url + "/metrics").status_code == 200


async def poll(cond, timeout: float = 60) -> None:
    """Wait until `cond()` holds; a liveness guard (a hung server fails the test), not a bound."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached within {timeout:g} s (server hung?)")
        await asyncio.sleep(0.05)


async def read_some(client: httpx.AsyncClient, url: str, body: dict, n_events: int) -> int:
    """Open a stream, read `n_events` SSE events, then drop the connection. Returns events read."""
    seen = 0
    async with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                seen += 1
                if seen >= n_events:
                    break
    return seen


async def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    # 240 tokens per request (the fixture's context is 256): a dropped stream that is not aborted runs to the end
    before = server.wait_idle()
    async with httpx.AsyncClient(timeout=30) as c:
        await read_some(c, server.url + "/v1/completions", LONG | {"stream": True, "max_tokens": 240}, 3)
        await read_some(c, server.url + "/generate_stream",
                        {"inputs": "Tell me a long story.", "parameters": {"max_new_tokens": 240}}, 3)
    after = server.wait_idle(timeout=60)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < 2 * 240  # aborted, not run to the end


async def test_disconnect_while_waiting_non_streaming_aborts(server):
    """The client drops a non-streaming request once the server says it runs (no client
    timeout to race the engine: a fast CPU once finished 200 tokens before a 0.5 s timeout)."""
    before = server.wait_idle()
    async with httpx.AsyncClient(timeout=60) as c:
        post = asyncio.create_task(c.post(server.url + "/v1/completions", json=LONG | {"max_tokens": 240}))
        await poll(lambda: post.done() or server.metrics()["vllm:num_requests_running"] >= 1)
        assert not post.done(), "the request finished before it could be dropped"
        post.cancel()  # closes the connection mid-request
        with pytest.raises(asyncio.CancelledError):
            await post
    after = server.wait_idle(timeout=60)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 240


@pytest.mark.slow  # starts a private server
async def test_full_queue_answers_503_with_retry_after(launch):
    s = launch("--max-num-seqs", "1", "--max-waiting", "2")
    async with httpx.AsyncClient(timeout=60) as c:
        hog = asyncio.create_task(read_some(c, s.url + "/v1/completions", LONG | {"stream": True}, 10**6))
        # the hog holds the only sequence slot and has its first token, so it no longer counts as waiting
        await poll(lambda: s.metrics()["vllm:time_to_first_token_seconds_count"] >= 1)
        queued = [asyncio.create_task(c.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}))
                  for _ in range(2)]
        await poll(lambda: s.metrics()["vllm:num_requests_waiting"] >= 2)
        r = await c.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "service_unavailable"
        r = await c.post(s.url + "/generate", json={"inputs": "x"})
        assert r.status_code == 429 and r.json()["error_type"] == "overloaded"
        hog.cancel()
        assert [q.status_code for q in await asyncio.gather(*queued)] == [200, 200]
    s.wait_idle(timeout=10)
    r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 200  # the gate reopened


@pytest.mark.slow  # starts a private server
def test_sigterm_finishes_in_flight_stream_then_exits(launch):
    s = launch()
    body = {"prompt": "Once", "max_tokens": 80, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    tokens, done = 0, False
    with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                tokens += 1
                break
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):  # no longer accepting
            httpx.get(s.url + "/health", timeout=2)
        for line in lines:
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                tokens += 1
    assert done and tokens == 80
    assert s.proc.wait(30) == 0


@pytest.mark.slow
async def test_100_streams_with_random_disconnects_leave_no_blocks(server):
    """Half the streams hang up early. Every block comes back, and the dropped requests stopped
    generating (a missing abort would let each run to 120 tokens: ~3x the tokens counted here)."""
    rng = random.Random(0)
    sem = asyncio.Semaphore(16)
    before = server.wait_idle()
    wanted: list[int] = []

    async def one(i: int, c: httpx.AsyncClient) -> None:
        async with sem:
            if i % 2:
                url, body = server.url + "/v1/completions", {"prompt": f"story {i}", "max_tokens": 120,
                                                             "ignore_eos": True, "stream": True}
            else:
                url, body = server.url + "/generate_stream", {"inputs": f"story {i}",
                                                              "parameters": {"max_new_tokens": 120}}
            n = rng.choice([1, 2, 5, 10, 10**6])
            wanted.append(min(n, 120))
            await read_some(c, url, body, n)

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=32)) as c:
        await asyncio.gather(*(one(i, c) for i in range(100)))
    m = server.wait_idle(timeout=60)
    assert m["vllm:kv_cache_usage_perc"] == 0 and m["vllm:num_requests_running"] == 0
    generated = m["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    slack = 16  # tokens a request may still make between the hang-up and its abort
    assert generated <= sum(w + slack for w in wanted) < 100 * 120 / 2
    assert httpx.get(server.url + "/health").status_code == 200


def test_cli_rejects_bad_arguments_before_starting(tmp_path, capsys):
    from reference_engine.server.cli import main

    assert main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([str(tmp_path), "--max-waiting", "0"]) == 2
    assert "max_waiting" in capsys.readouterr().err
