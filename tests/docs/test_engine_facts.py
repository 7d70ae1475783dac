"""The SGLang, TensorRT-LLM and TGI facts chapters 18-21 cite, pinned against their sources.

SGLang is read as text from the source installed in `.venv-sglang` (skipped where it is absent; CI installs it).
TensorRT-LLM and TGI are read from what the adapters recorded at their pinned tags
(`adapters/engines/<name>/upstream.json`, file@tag each), so those checks run everywhere. A version bump that
moves a default or drops an option fails here, naming the chapter to re-read. vLLM's are in test_vllm_facts.py.
"""
from __future__ import annotations

import json
import re

import pytest

from tests.docs import handbook as hb

SGLANG = next(iter(sorted(hb.REPO.glob(".venv-sglang/lib/python3*/site-packages/sglang"))), None)
SGLANG_VERSION = "0.5.23"


def chapter(stem: str) -> str:
    path = next(p for p in hb.CHAPTERS if p.stem.split("-", 1)[1] == stem)
    return " ".join(path.read_text().split())


def said(stem: str, *phrases: str) -> None:
    text = chapter(stem)
    missing = [p for p in phrases if p not in text]
    assert not missing, f"chapter {stem} no longer says {missing}"


def sglang(rel: str) -> str:
    if SGLANG is None:
        pytest.skip(".venv-sglang is not installed here (CI installs it)")
    return re.sub(r"\s+", " ", (SGLANG / rel).read_text())


def field(text: str, name: str) -> str:
    """One field of an SGLang argument dataclass: from `name: A[` to the next field."""
    m = re.search(rf"\b{name}: A\[(.*?)\] = ([^ ]+)", text)
    assert m, f"no field {name}"
    return m.group(0)


def test_the_installed_sglang_is_the_version_the_book_cites():
    if SGLANG is None:
        pytest.skip(".venv-sglang is not installed here (CI installs it)")
    assert (SGLANG.parent / f"sglang-{SGLANG_VERSION}.dist-info").is_dir()
    said("engines-compared", f"[16] SGLang {SGLANG_VERSION} as installed in `.venv-sglang`")


def test_sglang_disaggregation():
    said("engines-compared", "`--disaggregation-mode prefill` or `decode`, KV moved by `--disaggregation-transfer-backend` "
                             "(default `mooncake`; `nixl`, ...)")
    text = sglang("srt/arg_groups/fields/disagg.py")
    mode = field(text, "disaggregation_mode")
    assert 'Literal["null", "prefill", "decode"]' in mode and mode.endswith('"null"')
    assert field(text, "disaggregation_transfer_backend").endswith('"mooncake"')
    assert '"nixl",' in sglang("srt/arg_groups/choices.py")


def test_sglang_hicache():
    said("kv-cache-tiers", "HiCache offers both and a selective write-through, with `write_through` as its default "
                           "(`hicache_write_policy` in SGLang 0.5.23's `sglang/srt/arg_groups/fields/memory.py`)",
         "(HiCache's prefetch policies `best_effort`, `wait_complete`, `timeout`)",
         "`--hicache-ratio` (2.0 times the device pool by default in its `cache` mode)")
    said("engines-compared", "`--hicache-write-policy` (default `write_through`)")
    text = sglang("srt/arg_groups/fields/memory.py")
    policy = field(text, "hicache_write_policy")
    assert policy.endswith('"write_through"') and all(
        f'"{p}"' in policy for p in ("write_back", "write_through", "write_through_selective"))
    assert "Defaults to 2.0 in cache mode" in field(text, "hicache_ratio")
    assert field(text, "enable_hierarchical_cache").endswith("False")
    storage = field(text, "hicache_storage_backend")
    assert all(f'"{b}"' in storage for b in ("file", "mooncake", "hf3fs", "nixl"))
    prefetch = field(text, "hicache_storage_prefetch_policy")
    assert all(f'"{p}"' in prefetch for p in ("best_effort", "wait_complete", "timeout"))


def test_sglang_expert_parallelism():
    said("engines-compared", "`--ep-size`, `--moe-a2a-backend` (default `none`; `deepep`, `mooncake`, ...), attention "
                             "data-parallel with `--attn-dp-size`")
    parallel = sglang("srt/arg_groups/fields/parallel.py")
    assert '"--expert-parallel-size"' in field(parallel, "ep_size")
    assert '"--attention-data-parallel-size"' in field(parallel, "attn_dp_size")
    a2a = field(sglang("srt/arg_groups/fields/exec_.py"), "moe_a2a_backend")
    assert a2a.endswith('"none"') and '"deepep"' in a2a and '"mooncake"' in a2a


def recorded(engine: str) -> dict:
    return json.loads((hb.REPO / "adapters" / "engines" / engine / "upstream.json").read_text())


def test_tensorrt_llm_options_as_recorded():
    said("engines-compared", "[17] TensorRT-LLM v1.3.0rc24 (commit 1cef02e), `tensorrt_llm/llmapi/llm_args.py` as recorded",
         "`cache_transceiver_config`", "`moe_expert_parallel_size`, `moe_tensor_parallel_size`, `enable_attention_dp`",
         "host tier `KvCacheConfig.host_cache_size`, disk tier `disk_cache_size`, `disk_cache_path`")
    rec = recorded("trtllm")
    assert rec["tag"] == "v1.3.0rc24" and rec["commit"].startswith("1cef02e")
    args = json.dumps(rec["llm_args"])
    for name in ("cache_transceiver_config", "moe_expert_parallel_size", "moe_tensor_parallel_size", "enable_attention_dp",
                 "host_cache_size", "disk_cache_size", "disk_cache_path"):
        assert f'"{name}"' in args, name


def test_tgi_launcher_has_no_disaggregation_expert_or_offload_option():
    said("engines-compared", "[18] TGI v3.3.7 `launcher/src/main.rs`: every option", "`--num-shard` shards every layer "
                                                                                      "(tensor parallelism); no expert-parallel option")
    options = recorded("tgi")["launcher_flags"]["v3.3.7"]["options"]
    assert "--num-shard" in options and len(options) > 40  # the whole launcher, not a sample
    assert not [o for o in options if re.search(r"disagg|prefill-only|decode-only|expert|offload|host-cache|tier", o)]
