"""The CPU process's heap policy and readings: glibc's malloc keeps freed blocks (`keep_freed_cpu_memory`)
and gives them back on demand (`release_freed_cpu_memory`); the process's resident bytes and their
high-water (`rss`, `peak_rss`, `reset_peak_rss`: /proc/self/status VmRSS and VmHWM, the high-water reset
by writing "5" to /proc/self/clear_refs); and which of the weight panels and KV tensors sit on huge pages
(`huge_pages`). Off glibc or Linux each says so (False / None), never a guess.

A CPU runner's start-up brackets its allocations with `prepare` (before any weight) and `settle` (after
the last), so that the memory split can tell libraries, weights and KV from the steps' activations.
"""
from __future__ import annotations

import ctypes
import platform

import torch

from reference_engine.model import hugepages


def keep_freed_cpu_memory() -> bool:
    """CPU: make glibc's malloc keep freed blocks for reuse instead of returning them to the kernel.

    By default glibc serves every block of 128 KiB and more (a prefill chunk's activations are MBs)
    with a fresh mmap and unmaps it on free, so each layer's temporaries are page-faulted and
    zeroed again: a 2048 x 576 fp32 add took 0.32 ms that way against 0.10 ms from a kept heap.
    vLLM's CPU backend gets the same from tcmalloc (it asks for LD_PRELOAD); `mallopt` does it
    from inside the process. Cost: freed memory stays in the process (RSS holds its peak). Returns
    whether it was applied (glibc only)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


def release_freed_cpu_memory() -> bool:
    """Hand the heap's free pages back to the kernel once (glibc's `malloc_trim(0)`), despite
    `keep_freed_cpu_memory`: at the end of start-up, what loading and packing freed is not the steps'
    to reuse (SmolLM2 with one layout: the checkpoint's 178 MiB the KV cache did not take, resident
    until then); and by the engine core whenever it goes idle (engine_core: the largest batch's freed
    activations). False where there is no glibc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return True


def prepare() -> int | None:
    """Before any weight: keep freed memory (`keep_freed_cpu_memory`: activations reuse the heap, not fresh
    page-faulted mmaps), and import torch's reference ops, which the loader's meta-device model pulls in (an
    embedding's init on meta: ~145 MiB of modules, not weights), so that they count as libraries. -> the
    process's RSS then: the memory split's runtime_base (interpreter, libraries, tokenizer)."""
    keep_freed_cpu_memory()
    with torch.device("meta"):
        torch.nn.Embedding(1, 1)
    return rss()


def settle() -> int | None:
    """After the last start-up allocation: what start-up freed goes back first (else a step reusing it hides
    its activations), then the high-water is reset: from here on it is the steps' (activations, whose heap
    stays resident; kernel caches). -> RSS now, or None where the high-water cannot be reset."""
    release_freed_cpu_memory()
    return rss() if reset_peak_rss() else None


def rss() -> int | None:
    """This process's resident bytes now (VmRSS); None where /proc is absent."""
    return _status("VmRSS")


def peak_rss() -> int | None:
    """This process's resident high-water mark (VmHWM) since start or `reset_peak_rss`."""
    return _status("VmHWM")


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: "5" to /proc/self/clear_refs). Whether it was."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def huge_pages(model: torch.nn.Module, kv_cache: list[tuple[torch.Tensor, torch.Tensor]]) -> dict | None:
    """CPU: the mappings that hold the weight panels and the KV cache (model/hugepages.py: the kernel
    merges adjacent arenas into one mapping, so this is their sum), as {"mapped", "advised" (for huge
    pages), "huge" (resident on 2 MiB pages)} bytes; None without /proc (not Linux)."""
    from reference_engine.model.packed_linear import PackedLinear

    panels = [m.panels for m in model.modules() if isinstance(m, PackedLinear) and m.panels is not None]
    return hugepages.residency(panels + [t for pair in kv_cache for t in pair])
