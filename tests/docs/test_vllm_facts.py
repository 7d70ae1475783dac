"""The vLLM facts the handbook cites, pinned against the vLLM source installed in `.venv-vllm`.

Each fact is a sentence the chapter says (read with its whitespace collapsed) and a check of the file it
cites, read as text (vLLM is never imported: the checks take milliseconds). Where `.venv-vllm` is absent
the source checks are skipped; the chapter's wording is checked everywhere. A vLLM upgrade that moves a
default or reorders a rule fails here, naming the chapter to re-read.
"""
from __future__ import annotations

import ast
import re

import pytest

from tests.docs import handbook as hb

VLLM = next(iter(sorted(hb.REPO.glob(".venv-vllm/lib/python3*/site-packages/vllm"))), None)
VERSION = "0.32.0"


def chapter(stem: str) -> str:
    """A chapter's text, whitespace collapsed, by the part of its file name after the number."""
    path = next(p for p in hb.CHAPTERS if p.stem.split("-", 1)[1] == stem)
    return " ".join(path.read_text().split())


def source(rel: str) -> str:
    if VLLM is None:
        pytest.skip(".venv-vllm is not installed here (CI installs it)")
    return (VLLM / rel).read_text()


def segment(rel: str, qualname: str) -> str:
    """The source text of a function or method (`Class.method`) in a vLLM file."""
    text = source(rel)
    body, node = ast.parse(text).body, None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        assert node is not None, f"{rel} defines no {qualname}"
        body = node.body
    return ast.get_source_segment(text, node)


def in_order(text: str, *parts: str) -> None:
    """Every part occurs in text, each after the one before it."""
    at = 0
    for p in parts:
        i = text.find(p, at)
        assert i >= 0, f"{p!r} not found after offset {at}"
        at = i + len(p)


def said(stem: str, *phrases: str) -> None:
    text = chapter(stem)
    missing = [p for p in phrases if p not in text]
    assert not missing, f"chapter {stem} no longer says {missing}"


def test_the_installed_vllm_is_the_version_the_book_cites():
    assert re.search(rf"__version__ = version = '{re.escape(VERSION)}'", source("_version.py"))


def test_kv_cache_gpu_memory_utilization_default():
    said("kv-cache", "0.92 by default (`CacheConfig.gpu_memory_utilization` in `vllm/config/cache.py`, vLLM 0.32.0)")
    assert re.search(r"gpu_memory_utilization: float = Field\(default=0\.92\b", source("config/cache.py"))


def test_sampling_order():
    said("sampling", "`Sampler.forward` and `Sampler.sample` in `vllm/v1/sample/sampler.py`",
         "logits to float32, the non-argmax-invariant processors (min-tokens, logit bias), penalties, the greedy "
         "argmax, temperature, the argmax-invariant processors (min-p")
    in_order(segment("v1/sample/sampler.py", "Sampler.forward"),
             "logits = logits.to(torch.float32)", "self.apply_logits_processors(", "self.sample(logits")
    in_order(segment("v1/sample/sampler.py", "Sampler.apply_logits_processors"),
             "logitsprocs.non_argmax_invariant", "self.apply_penalties(")
    in_order(segment("v1/sample/sampler.py", "Sampler.sample"), "self.greedy_sample(logits)",
             "self.apply_temperature(", "logitsprocs.argmax_invariant", "self.topk_topp_sampler(")
    assert "class MinPLogitsProcessor" in source("v1/sample/logits_processor/builtin.py")


def test_only_temperature_zero_is_greedy():
    said("sampling", "vLLM raises any 0 < T < 0.01 to 0.01", "`__post_init__` in `vllm/sampling_params.py`",
         "*before* its greedy test T < 1e-5 (`_SAMPLING_EPS`)")
    text = source("sampling_params.py")
    assert re.search(r"^_SAMPLING_EPS = 1e-5$", text, re.M) and re.search(r"^_MAX_TEMP = 1e-2$", text, re.M)
    in_order(segment("sampling_params.py", "SamplingParams.__post_init__"),
             "if 0 < self.temperature < _MAX_TEMP:", "self.temperature = max(self.temperature, _MAX_TEMP)",
             "if self.temperature < _SAMPLING_EPS:")


def test_scheduling_budget_defaults():
    said("scheduling", "least 160 GiB (B200, B300) `vllm serve` and the offline `LLM` class both use "
                       "`max_num_batched_tokens` = 16,384",
         "with at least 70 GiB and not an A100", "`vllm serve` uses 8,192 and `LLM` 16,384; on smaller GPUs 2,048 "
                                                 "and 8,192; on a CPU 2,048 and 4,096, each × world size")
    code = re.sub(r"\s+", " ", segment("engine/arg_utils.py", "EngineArgs.get_batch_defaults"))
    in_order(code, "if device_memory >= 160 * GiB_bytes:", "UsageContext.LLM_CLASS: 16384,",
             "UsageContext.OPENAI_API_SERVER: 16384,",
             'elif device_memory >= 70 * GiB_bytes and "a100" not in device_name:',
             "UsageContext.LLM_CLASS: 16384,", "UsageContext.OPENAI_API_SERVER: 8192,", "else:",
             "UsageContext.LLM_CLASS: 8192,", "UsageContext.OPENAI_API_SERVER: 2048,", "if current_platform.is_cpu():",
             "UsageContext.LLM_CLASS: 4096 * world_size,", "UsageContext.OPENAI_API_SERVER: 2048 * world_size,")


def test_block_size_default():
    said("paged-memory", "vLLM's default is 16 tokens (`CacheConfig.DEFAULT_BLOCK_SIZE`",
         "vLLM-CPU uses 128")
    assert "DEFAULT_BLOCK_SIZE: ClassVar[int] = 16" in source("config/cache.py")
    in_order(source("platforms/cpu.py"), "elif not cache_config.user_specified_block_size:",
             "cache_config.block_size = 128")
    assert "preferred = cls._preferred_block_size_for_backends(" in source("platforms/interface.py")


def test_cuda_graph_capture_sizes():
    said("gpu-and-roofline", "vLLM 0.32.0 captures `[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)`",
         "min(2 × `max_num_seqs` × decode query length, 512) (1,024 on data-centre Blackwell)")
    code = segment("config/vllm.py", "VllmConfig._set_cudagraph_sizes")
    assert "1024 if current_platform.is_device_capability_family(100) else 512" in code
    assert "max_num_seqs * decode_query_len * 2, default_max_graph_size" in code
    in_order(code, "range(8, min(max_cudagraph_capture_size + 1, 256), 8)", "range(256, max_cudagraph_capture_size + 1, 16)")


def test_async_scheduling_default_and_its_exceptions():
    said("engines-compared", "`SchedulerConfig.async_scheduling` defaults to `None` (`vllm/config/scheduler.py`)",
         "the model is a pooling model; speculation uses a method other than those of `EagleModelTypes` (EAGLE, "
         "EAGLE-3, MTP, DFlash, `extract_hidden_states`), `ngram_gpu`, `draft_model` or `dspark`",
         "speculation sets `disable_padded_drafter_batch`", "ROCm runs DeepEP high-throughput all-to-all with "
         "dual-batch overlap; or pipeline parallelism runs on the V1 model runner")
    assert re.search(r"async_scheduling: bool \| None = None", source("config/scheduler.py"))
    code = segment("config/vllm.py", "VllmConfig.__post_init__")
    branch = code[code.index("elif self.scheduler_config.async_scheduling is None:"):]
    in_order(branch, 'runner_type == "pooling"', "not in get_args(EagleModelTypes)", "not in get_args(NgramGPUTypes)",
             '!= "draft_model"', '!= "dspark"', '!= "dflash"', "disable_padded_drafter_batch",
             "not executor_supports_async_sched", "uses_rocm_deepep_ht_dbo", "pipeline_parallel_size > 1",
             "not self.use_v2_model_runner", "async_scheduling = True")
    eagle = re.search(r"^EagleModelTypes = Literal\[(.*?)\]", source("config/speculative.py"), re.S | re.M).group(1)
    assert all(m in eagle for m in ('"eagle"', '"eagle3"', '"extract_hidden_states"', "MTPModelTypes", "DFlashModelTypes"))


def test_the_functions_chapter_15_cites_exist():
    said("engines-compared", "[1] vLLM `vllm/v1/core/sched/scheduler.py`, `Scheduler.schedule`",
         "[3] vLLM `vllm/v1/engine/core.py` (`EngineCoreProc.run_busy_loop`)")
    segment("v1/core/sched/scheduler.py", "Scheduler.schedule")
    segment("v1/engine/core.py", "EngineCoreProc.run_busy_loop")


def test_every_vllm_path_the_handbook_names_exists():
    """Every `vllm/...py` path a chapter names is a file of the installed vLLM."""
    named = {m for c in hb.CHAPTERS for m in re.findall(r"`vllm/([\w/]+\.py)`", c.read_text())}
    assert named
    source("version.py")  # skips where vLLM is absent
    missing = sorted(p for p in named if not (VLLM / p).is_file())
    assert not missing, missing


def test_attention_kernel_facts():
    said("attention-kernel", "(`MLAAttentionSpec` in `vllm/v1/kv_cache_interface.py`, vLLM 0.32.0)",
         "(`SlidingWindowManager.find_longest_cache_hit` in `vllm/v1/core/single_type_kv_cache_manager.py`, vLLM 0.32.0)",
         "vLLM looks for ⌈(w − 1) / block size⌉ contiguous cached blocks, scanning from the right")
    spec = segment("v1/kv_cache_interface.py", "MLAAttentionSpec")
    assert "head_size_v: int = 0" in spec and "no separate V" in spec
    blocks = segment("v1/core/single_type_kv_cache_manager.py", "SlidingWindowManager._contiguous_blocks_for_hit")
    assert "cdiv(window_size - 1, block_size)" in blocks
    hit = segment("v1/core/single_type_kv_cache_manager.py", "SlidingWindowManager.find_longest_cache_hit")
    in_order(hit, "block_pool.null_block", "for i in range(max_num_blocks - 1, -1, -1):")


def test_quantization_facts():
    said("quantization", "vLLM lists `fp8` among its `QuantizationMethods`, with online shorthands such as "
                         "`fp8_per_channel` and `int8_per_channel_weight_only`",
         "(`--kv-cache-dtype fp8`, which is `fp8_e4m3`, or `fp8_e5m2`: `CacheConfig.cache_dtype` in `vllm/config/cache.py`)")
    methods = re.search(r"^QuantizationMethods = Literal\[(.*?)^\]", source("model_executor/layers/quantization/__init__.py"),
                        re.S | re.M).group(1)
    assert all(f'"{m}"' in methods for m in ("fp8", "fp8_per_channel", "int8_per_channel_weight_only"))
    cache = source("config/cache.py")
    dtypes = re.search(r"^CacheDType = Literal\[(.*?)^\]", cache, re.S | re.M).group(1)
    assert all(f'"{m}"' in dtypes for m in ("fp8", "fp8_e4m3", "fp8_e5m2"))
    assert 'cache_dtype: CacheDType = "auto"' in cache and "supports fp8 (=fp8_e4m3) and fp8_e5m2" in cache


def test_tensor_parallel_facts():
    said("parallelism", "it requires the attention heads to divide by the tensor-parallel size, and replicates KV heads "
                        "when there are fewer of them than ranks: `ModelConfig.verify_with_parallel_config` and "
                        "`ModelConfig.get_num_kv_heads` in `vllm/config/model.py`, vLLM 0.32.0")
    assert "if total_num_attention_heads % tensor_parallel_size != 0:" in segment(
        "config/model.py", "ModelConfig.verify_with_parallel_config")
    said("parallelism", "vLLM gives each rank max(1, KV heads ÷ ranks) of them, and exactly one for an MLA model, "
                        "whose latent has no heads to split (`if self.use_mla: return 1`)")
    kv = segment("config/model.py", "ModelConfig.get_num_kv_heads")
    assert "max(1, total_num_kv_heads // parallel_config.tensor_parallel_size)" in kv
    in_order(kv, "if self.use_mla:", "return 1", "max(1, total_num_kv_heads")


def test_disaggregation_facts():
    said("disaggregated-serving", "`request.num_computed_tokens = request.num_tokens - 1` in "
                                  "`Scheduler._update_waiting_for_remote_kv` (`vllm/v1/core/sched/scheduler.py`, vLLM 0.32.0)",
         "(`get_num_new_matched_tokens`)", "(`update_state_after_alloc`)", "(`start_load_kv`, with `wait_for_layer_load` "
         "letting each attention layer wait for its own layer only)", "parks the request in `WAITING_FOR_REMOTE_KVS`",
         "a connector whose `request_finished` returns True takes over freeing")
    assert "request.num_computed_tokens = request.num_tokens - 1" in segment(
        "v1/core/sched/scheduler.py", "Scheduler._update_waiting_for_remote_kv")
    base = segment("distributed/kv_transfer/kv_connector/v1/base.py", "KVConnectorBase_V1")
    for method in ("get_num_new_matched_tokens", "update_state_after_alloc", "start_load_kv", "wait_for_layer_load",
                   "request_finished"):
        assert f"def {method}(" in base, method
    assert "Block until the KV for a specific layer is loaded" in base
    assert "True if the request is being saved/sent asynchronously and blocks" in base
    assert "WAITING_FOR_REMOTE_KVS = enum.auto()" in source("v1/request.py")
    factory = source("distributed/kv_transfer/kv_connector/factory.py")
    for name in ("NixlConnector", "MooncakeConnector", "LMCacheConnectorV1", "OffloadingConnector"):
        assert f'"{name}"' in factory, name
    said("disaggregated-serving", "its `NixlConnector`, `MooncakeConnector`, `LMCacheConnectorV1` and others are registered in "
                                  "`vllm/distributed/kv_transfer/kv_connector/factory.py`")


def test_moe_facts():
    said("mixture-of-experts", "vLLM's `all2all_backend`, default `allgather_reducescatter`",
         "(`EPLBConfig.window_size`, 1,000)", "(`num_redundant_experts`), every `step_interval` steps (3,000)",
         "(`moe_align_block_size`, which \"pads the number of tokens that each expert needs to process so that it is "
         "divisible by block_size\")")
    parallel = source("config/parallel.py")
    assert 'all2all_backend: All2AllBackend = "allgather_reducescatter"' in parallel
    assert "enable_expert_parallel: bool = False" in parallel and "enable_eplb: bool = False" in parallel
    eplb = segment("config/parallel.py", "EPLBConfig")
    assert all(x in eplb for x in ("window_size: int = Field(default=1000", "step_interval: int = Field(default=3000",
                                   "num_redundant_experts: int = Field(default=0"))
    align = re.sub(r"\s+", " ", source("model_executor/layers/fused_moe/moe_align_block_size.py"))
    assert "pads the number of tokens that each expert needs to process so that it is divisible by block_size" in align
    assert "def fused_moe_kernel(" in source("model_executor/layers/fused_moe/fused_moe.py")


def test_kv_offloading_facts():
    said("kv-cache-tiers", "vLLM adds a CPU tier with `--kv-offloading-size` (GiB), served by its own `OffloadingConnector` "
                           "or by LMCache (`kv_offloading_backend`, `native` or `lmcache`")
    cache = source("config/cache.py")
    assert 'KVOffloadingBackend = Literal["native", "lmcache"]' in cache
    assert "kv_offloading_size: float | None = None" in cache and "Size of the KV cache offloading buffer in GiB" in cache
    post = segment("config/vllm.py", "VllmConfig._post_init_kv_transfer_config")
    in_order(post, 'if kv_offloading_backend == "native":', '"OffloadingConnector"', 'elif kv_offloading_backend == "lmcache":',
             '"LMCacheMPConnector"')
