"""Maps a config's `engine = "..."` to an adapter class, imported only when used.

Importing this module never imports an engine package: a missing vLLM shows up
as `EngineUnavailable` at `start()`, naming what to install.
"""
from __future__ import annotations

import importlib

from adapters.base import Engine

# name -> "module:Class"
ADAPTERS: dict[str, str] = {
    "reference": "adapters.reference:ReferenceEngine",
    "hf": "adapters.hf:HFEngine",
    "openai": "adapters.openai_compat:OpenAIEngine",
    "vllm": "adapters.vllm:VLLMEngine",
    "sglang": "adapters.sglang:SGLangEngine",
    "trtllm": "adapters.trtllm:TRTLLMEngine",
    "tgi": "adapters.tgi:TGIEngine",
}


def names() -> list[str]:
    return list(ADAPTERS)


def get(name: str) -> type[Engine]:
    if name not in ADAPTERS:
        raise KeyError(f"unknown engine {name!r}; known engines: {', '.join(ADAPTERS)}")
    module, cls = ADAPTERS[name].split(":")
    return getattr(importlib.import_module(module), cls)
