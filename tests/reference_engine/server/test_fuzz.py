"""Property-based fuzzing of the server's own OpenAPI schema (schemathesis + hypothesis).

Every operation in /openapi.json gets a bounded number of generated requests, schema-valid
(positive) and schema-violating (negative) alike, against a private server with a short context
(64 tokens) so the cases that do generate finish fast. No answer may be a 5xx and the server must
be alive and idle afterwards. Failures are collected (not raised inside hypothesis, which would
spend minutes shrinking) and reported together.
"""
from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from pydantic import ValidationError
from schemathesis import GenerationMode

from reference_engine.server import protocol

pytestmark = pytest.mark.slow
CASES_PER_OPERATION = 25
# The body model of each POST route. A "negative" case that the model still accepts in pydantic's
# lax mode (`"stream": 0.0` for a bool, as vLLM's pydantic models accept too) is not refused;
# every other schema-breaking body must be.
BODY_MODELS = {"POST /v1/completions": protocol.CompletionRequest,
               "POST /v1/chat/completions": protocol.ChatCompletionRequest,
               "POST /generate": protocol.TGIRequest, "POST /generate_stream": protocol.TGIRequest,
               "POST /": protocol.TGICompatRequest, "POST /tokenize": protocol.TokenizeRequest}


def _lax_valid(label: str, body) -> bool:
    model = BODY_MODELS.get(label)
    try:
        return model is not None and model.model_validate(body) is not None
    except ValidationError:
        return False


@pytest.fixture(scope="module")
def fuzz_server(launch_session):
    return launch_session("--max-model-len", "64", "--max-waiting", "16")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_no_server_errors(fuzz_server, mode):
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {"POST /v1/completions", "POST /v1/chat/completions", "POST /generate", "POST /"} <= \
        {op.label for op in operations}
    failures: list[str] = []
    sent = 0
    statuses: dict[int, int] = {}

    for op in operations:
        if mode is GenerationMode.NEGATIVE and op.method.upper() == "GET":
            continue  # nothing to make invalid: these GETs take no parameters
        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=CASES_PER_OPERATION, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case):
            nonlocal sent
            sent += 1
            try:
                r = case.call(timeout=60)
            except Exception as err:  # the server must not drop connections either
                failures.append(f"{op.label}: {type(err).__name__}: {err} for {case.body!r}")
                return
            if mode is GenerationMode.NEGATIVE and r.status_code < 400 and _lax_valid(op.label, case.body):
                return  # not actually invalid for the route's model (see BODY_MODELS)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code >= 500:
                failures.append(f"{op.label}: {r.status_code} {r.text[:300]} for {case.body!r}")

        run()
    assert sent >= 5 * sum(op.method.upper() == "POST" for op in operations)
    assert not failures, "\n".join(failures[:20])
    if mode is GenerationMode.NEGATIVE:  # a body that breaks the schema is refused, never served
        assert all(400 <= code < 500 for code in statuses), statuses
    else:
        assert statuses.get(200, 0) > 0 and any(400 <= code < 500 for code in statuses), statuses


def test_alive_and_idle_after_fuzzing(fuzz_server):
    m = fuzz_server.wait_idle(timeout=60)
    assert m["vllm:kv_cache_usage_perc"] == 0
    assert httpx.get(fuzz_server.url + "/health").status_code == 200
    r = httpx.post(fuzz_server.url + "/v1/completions", json={"prompt": "still here", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
