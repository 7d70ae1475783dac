"""The attention backends by name, and which one a device gets by default.

Backends that need an optional package (triton) or a C++ build (cpu) are imported only when
chosen, so the engine imports without them.
"""
from __future__ import annotations

import importlib

import torch

from reference_engine.attention.interface import AttentionBackend
from reference_engine.attention.torch_backend import TorchBackend
from reference_engine.kernels import ops

BACKENDS: dict[str, type[AttentionBackend]] = {"torch": TorchBackend}
# Backends that need an optional package, imported only when chosen so that the engine imports
# without it: name -> "module:function" returning the class (or raising a one-line ImportError).
LAZY_BACKENDS: dict[str, str] = {"triton": "reference_engine.attention.triton_backend:backend_class",
                                 "cpu": "reference_engine.attention.cpu_backend:backend_class"}


def get_backend(name: str) -> type[AttentionBackend]:
    if name not in BACKENDS and name in LAZY_BACKENDS:
        module, func = LAZY_BACKENDS[name].split(":")
        BACKENDS[name] = getattr(importlib.import_module(module), func)()
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {', '.join({**BACKENDS, **LAZY_BACKENDS})}")
    return BACKENDS[name]


def default_attention_backend(device: str | torch.device | None = None) -> str:
    """"triton" when the engine runs on CUDA and triton imports, "cpu" on CPU where the C++ kernels
    build (`cpu_backend.py`, `kernels/ops.available`), else "torch".

    `device` is the engine's device; None means CUDA if torch sees one."""
    if device is None:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        dev = torch.device(device)
    if dev.type == "cuda":
        from reference_engine.attention import triton_backend
        return "triton" if triton_backend.triton_available() else "torch"
    if dev.type == "cpu":
        return "cpu" if ops.available() else "torch"
    return "torch"
