"""/metrics: Prometheus text that prometheus_client parses, vLLM's names, counters equal to what was sent."""
from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import KV_TOKENS

VLLM_NAMES = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:time_to_first_token_seconds",
              "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:num_preemptions",
              "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:cache_config_info",
              "vllm:request_success"}


@pytest.mark.slow  # starts a private server, to count from zero
def test_metrics_parse_and_count_what_was_sent(launch, model_dir):
    s = launch()
    idle = s.metrics()
    assert idle["vllm:prompt_tokens_total"] == 0 and idle["vllm:request_success_total{finished_reason=\"length\"}"] == 0

    prompt_tokens = completion_tokens = requests = 0
    lengths = [3, 7, 12]
    for n in lengths:  # non-streamed completions
        u = httpx.post(s.url + "/v1/completions", json={"prompt": f"count {n}", "max_tokens": n,
                                                       "ignore_eos": True}).json()["usage"]
        prompt_tokens += u["prompt_tokens"]
        completion_tokens, requests = completion_tokens + n, requests + 1
    body = {"prompt": "stream me", "max_tokens": 5, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", s.url + "/v1/completions", json=body) as r:
        usage_line = [line for line in r.iter_lines() if '"usage":{' in line][0]
    assert '"completion_tokens":5' in usage_line
    prompt_tokens += int(usage_line.split('"prompt_tokens":')[1].split(",")[0])
    completion_tokens, requests = completion_tokens + 5, requests + 1
    u = httpx.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 4, "ignore_eos": True, "n": 2}).json()["usage"]
    prompt_tokens += 2 * u["prompt_tokens"]  # the engine prefills the prompt once per choice
    completion_tokens, requests = completion_tokens + 8, requests + 2
    d = httpx.post(s.url + "/generate", json={"inputs": "tgi", "parameters": {"max_new_tokens": 6,
                                                                                 "details": True}}).json()["details"]
    prompt_tokens += len(httpx.post(s.url + "/tokenize", json={"inputs": "tgi"}).json())
    completion_tokens, requests = completion_tokens + d["generated_tokens"], requests + 1
    assert httpx.post(s.url + "/v1/completions", json={"prompt": ""}).status_code == 400  # counts nothing

    text = httpx.get(s.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert VLLM_NAMES <= set(families)
    m = s.wait_idle()
    assert m["vllm:prompt_tokens_total"] == prompt_tokens
    assert m["vllm:generation_tokens_total"] == completion_tokens
    finished = m['vllm:request_success_total{finished_reason="length"}'] + \
        m['vllm:request_success_total{finished_reason="stop"}']
    assert finished == requests
    assert m["vllm:time_to_first_token_seconds_count"] == requests
    assert m["vllm:e2e_request_latency_seconds_count"] == requests
    assert m["vllm:inter_token_latency_seconds_count"] == completion_tokens - requests  # one gap per later token
    # each request's first token comes before its end: the TTFT total cannot exceed the E2E total
    assert m["vllm:time_to_first_token_seconds_sum"] <= m["vllm:e2e_request_latency_seconds_sum"]
    assert m["vllm:num_preemptions_total"] == 0 and m["vllm:kv_cache_usage_perc"] == 0
    (info,) = families["vllm:cache_config_info"].samples
    assert info.value == 1 and info.labels["block_size"] == "16"
    assert int(info.labels["num_gpu_blocks"]) == KV_TOKENS // 16
    buckets = [x for x in families["vllm:time_to_first_token_seconds"].samples if x.name.endswith("_bucket")]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == requests


def test_metrics_show_running_requests_and_kv_usage(server):
    with httpx.stream("POST", server.url + "/v1/completions",
                      json={"prompt": "busy", "max_tokens": 100, "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()  # keep the iterator: dropping it would close the connection (= abort)
        next(line for line in lines if line.startswith("data: {"))
        m = server.metrics()
        assert m["vllm:num_requests_running"] == 1
        assert 0 < m["vllm:kv_cache_usage_perc"] <= 1
        assert sum(line.startswith("data: {") for line in lines) == 99
    assert server.wait_idle(timeout=10)["vllm:kv_cache_usage_perc"] == pytest.approx(0)


SPEC_NAMES = {"vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
              "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos"}


@pytest.mark.slow  # a private server with a draft model and a custom served name
def test_prefix_cache_and_spec_decode_metrics_and_reset_route(launch, model_dir):
    spec = '{"method": "draft_model", "model": "%s", "num_speculative_tokens": 3}' % model_dir
    s = launch("--speculative-config", spec)
    text = httpx.get(s.url + "/metrics").text
    assert SPEC_NAMES <= {f.name for f in text_string_to_metric_families(text)}
    assert f'model_name="{model_dir}"' in text  # the served name is the model argument as given
    body = {"prompt": "a shared prompt " * 8, "max_tokens": 12, "ignore_eos": True, "temperature": 0}
    first = httpx.post(s.url + "/v1/completions", json=body).json()
    m = s.wait_idle()
    assert m["vllm:prefix_cache_hits_total"] == 0 and m["vllm:prefix_cache_queries_total"] > 0
    again = httpx.post(s.url + "/v1/completions", json=body).json()
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    m = s.wait_idle()
    assert m["vllm:prefix_cache_hits_total"] > 0
    drafts, tokens = m["vllm:spec_decode_num_drafts_total"], m["vllm:spec_decode_num_draft_tokens_total"]
    per_pos = [m[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{j}"}}'] for j in range(3)]
    assert 0 < drafts <= tokens <= 3 * drafts
    assert sum(per_pos) == m["vllm:spec_decode_num_accepted_tokens_total"] == tokens  # its own draft: all accepted

    assert httpx.post(s.url + "/reset_prefix_cache").status_code == 200
    hits = s.metrics()["vllm:prefix_cache_hits_total"]
    httpx.post(s.url + "/v1/completions", json=body)
    assert s.wait_idle()["vllm:prefix_cache_hits_total"] == hits  # nothing cached any more
    with httpx.stream("POST", s.url + "/v1/completions", json={**body, "max_tokens": 150, "stream": True}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: {"))
        busy = httpx.post(s.url + "/reset_prefix_cache")
        assert busy.status_code == 409 and "hold" in busy.json()["error"]["message"]
        assert httpx.post(s.url + "/reset_prefix_cache?reset_running_requests=true").status_code == 200
        rest = [line for line in lines if line.startswith("data: {")]
    assert rest and s.wait_idle()["vllm:num_preemptions_total"] == 1
