"""Memory accounting (the runner's): what the engine's memory holds, how big its KV cache may be,
and the KV tensors themselves (`bytes_per_token`, `capacity_blocks`, `allocate_kv_cache`). The block
ids that index those tensors are the scheduler's (`core/block_pool.py`, `core/kv_cache_manager.py`).

    device total = weights + KV cache + activations (peak) + CUDA graph pool
                   + memory torch does not manage (CUDA context, cuBLAS and Triton modules)
                   + free (and other processes)

Sources: tensor sizes (weights, KV: known on any device); `torch.cuda` (`mem_get_info`: the device's
free and total bytes; `memory_allocated` / `max_memory_allocated` / `memory_reserved`: torch's
caching allocator); NVML through nvidia-ml-py (`pynvml`: the device's used bytes and this process's,
as nvidia-smi shows them), when it is installed. Off CUDA the report has no device keys, never a
guess; on CPU the process's own counters stand in (`rss`, `peak_rss`: /proc/self/status VmRSS and
VmHWM, the high-water reset by writing "5" to /proc/self/clear_refs; see `model_runner.memory`).

KV sizing from `gpu_memory_utilization` follows vLLM: the engine may use `utilization x total`
bytes; the KV cache gets what is left after the weights, the peak activations of a profile forward
over a full token budget, the memory torch does not manage, and a reserve for CUDA graphs (the
activation peak once more: a graph's bucket holds at most that many tokens). Another process's
memory is not the engine's to take: if less than `utilization x total` is free at start, it is an
error, as in vLLM.
"""
from __future__ import annotations

import ctypes
import os
import warnings
import platform
from dataclasses import dataclass

import torch

from reference_engine.config import DEFAULT_KV_BYTES, EngineConfig, ModelConfig
from reference_engine.model import hugepages

GiB = float(1 << 30)


def gib(n: int | float) -> str:
    return f"{n / GiB:.2f} GiB"


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


def param_bytes(*modules: torch.nn.Module | None) -> int:
    """Bytes of the modules' parameters and buffers, each storage counted once (tied weights)."""
    seen, total = set(), 0
    for m in modules:
        if m is None:
            continue
        for t in list(m.parameters()) + list(m.buffers()):
            key = (t.device, t.untyped_storage().data_ptr())
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


def kv_budget(utilization: float, total: int, free_at_start: int, weights: int, activation_peak: int,
              non_torch: int, graph_reserve: int = 0) -> int:
    """Bytes the KV cache may take (vLLM's gpu_memory_utilization rule; see the module docstring).
    One-line ValueError when the share is not free at start or leaves nothing for the cache."""
    requested = int(total * utilization)
    if requested > free_at_start:
        raise ValueError(f"gpu_memory_utilization {utilization} asks for {gib(requested)} of {gib(total)}, but only "
                         f"{gib(free_at_start)} was free at start; lower it or free the device")
    taken = weights + activation_peak + non_torch + graph_reserve
    if requested - taken <= 0:
        raise ValueError(f"gpu_memory_utilization {utilization} leaves no room for the KV cache: {gib(requested)} "
                         f"< weights {gib(weights)} + activations {gib(activation_peak)} + non-torch "
                         f"{gib(non_torch)} + graph reserve {gib(graph_reserve)}; raise it or use kv_cache_tokens")
    return requested - taken


def bytes_per_token(model: ModelConfig, dtype: torch.dtype) -> int:
    """K and V, every layer, one token."""
    return model.kv_bytes_per_token(dtype)


def capacity_blocks(cfg: EngineConfig, model: ModelConfig, dtype: torch.dtype, max_model_len: int,
                    extra_bytes_per_token: int = 0) -> int:
    """Blocks from the budget given in tokens or bytes (default: DEFAULT_KV_BYTES, capped).
    `extra_bytes_per_token`: a draft model's KV, which lives in the same block ids."""
    per_tok = bytes_per_token(model, dtype) + extra_bytes_per_token
    if cfg.kv_cache_tokens is not None:
        tokens = cfg.kv_cache_tokens
    elif cfg.kv_cache_bytes is not None:
        tokens = cfg.kv_cache_bytes // per_tok
    else:
        tokens = min(DEFAULT_KV_BYTES // per_tok, cfg.max_num_seqs * max_model_len)
    return tokens // cfg.block_size


def allocate_kv_cache(model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: str | torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (K, V), each (num_blocks, block_size, kv_heads, head_dim), zeros. On CPU all of them in
    one huge-page arena (model/hugepages.py: a decode step gathers its blocks from across the cache),
    written once here so that the cache is resident from the start, as a GPU's is."""
    shape = (num_blocks, block_size, model.num_kv_heads, model.head_dim)
    if torch.device(device).type != "cpu":
        return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                for _ in range(model.num_layers)]
    arena = hugepages.Arena(2 * model.num_layers * hugepages.size(shape, dtype))
    return [(arena.take(shape, dtype).zero_(), arena.take(shape, dtype).zero_()) for _ in range(model.num_layers)]


def huge_pages(model: torch.nn.Module, kv_cache: list[tuple[torch.Tensor, torch.Tensor]]) -> dict | None:
    """CPU: the mappings that hold the weight panels and the KV cache (model/hugepages.py: the kernel
    merges adjacent arenas into one mapping, so this is their sum), as {"mapped", "advised" (for huge
    pages), "huge" (resident on 2 MiB pages)} bytes; None without /proc (not Linux)."""
    from reference_engine.model.packed_linear import PackedLinear

    panels = [m.panels for m in model.modules() if isinstance(m, PackedLinear) and m.panels is not None]
    return hugepages.residency(panels + [t for pair in kv_cache for t in pair])


@dataclass
class Snapshot:
    free: int
    total: int
    reserved: int  # torch's caching allocator


def expandable_segments() -> bool:
    """Let torch's CUDA allocator grow its segments in place (`expandable_segments:True`), unless the
    user configured the allocator (PYTORCH_CUDA_ALLOC_CONF). The KV budget subtracts the peaks torch
    *allocated*; with fixed segments the memory it *reserved* around them (blocks split for one
    shape and left unusable for the next) comes on top: on the H200 at gpu_memory_utilization=0.5,
    Qwen3-0.6B's peak reserved memory overshot the share by 0.47-0.69 GiB with fixed segments and stayed
    0.31 GiB under it with expandable ones (docs/perf/2026-12-04-gpu-check-h200.md). True if set here."""
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF"):
        return False
    with warnings.catch_warnings():  # torch 2.13 names a newer private setter; this one is the one run on the H200
        warnings.simplefilter("ignore", FutureWarning)
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")  # also what vLLM's sleep mode toggles
    return True


class DeviceMemory:
    """`torch.cuda` and NVML readings for one device. Off CUDA every reading is None / empty."""

    def __init__(self, device: str | torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._nvml = None  # (pynvml module, handle), found on first use
        self.expandable = self.cuda and expandable_segments()  # before the engine's first allocation

    def snapshot(self) -> Snapshot | None:
        if not self.cuda:
            return None
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        return Snapshot(free, total, torch.cuda.memory_reserved(self.device))

    def non_torch_since(self, start: Snapshot) -> int:
        """Device memory taken since `start` that torch's allocator does not hold (context, modules)."""
        now = self.snapshot()
        return max(0, (start.free - now.free) - (now.reserved - start.reserved))

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.cuda else 0

    def peak(self) -> int:
        if not self.cuda:
            return 0
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)

    def empty_cache(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()

    def free(self) -> int | None:
        return self.snapshot().free if self.cuda else None

    def report(self) -> dict[str, int]:
        """Device-wide readings now: device_total, torch_allocated / torch_reserved /
        torch_peak_allocated, and from NVML device_used and (when NVML lists it) process_used."""
        if not self.cuda:
            return {}
        s = self.snapshot()
        out = {"device_total": s.total, "device_free": s.free, "torch_allocated": self.allocated(),
               "torch_reserved": s.reserved, "torch_peak_allocated": self.peak()}
        out.update(self.nvml())
        return out

    def nvml(self) -> dict[str, int]:
        """NVML's view (nvidia-ml-py): device_used, and process_used when this pid is listed (not
        always in containers). Empty when nvidia-ml-py is missing or NVML fails."""
        try:
            nv, handle = self._nvml or self._open_nvml()
            out = {"device_used": int(nv.nvmlDeviceGetMemoryInfo(handle).used)}
            for p in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == os.getpid() and p.usedGpuMemory is not None:
                    out["process_used"] = int(p.usedGpuMemory)
            return out
        except Exception:  # NVML is an optional second opinion; torch's readings stand on their own
            return {}

    def _open_nvml(self):
        import pynvml as nv

        nv.nvmlInit()
        try:  # the same GPU as torch's, whatever CUDA_VISIBLE_DEVICES renumbered
            uuid = torch.cuda.get_device_properties(self.device).uuid
            handle = nv.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except Exception:
            handle = nv.nvmlDeviceGetHandleByIndex(self.device.index or 0)
        self._nvml = (nv, handle)
        return self._nvml
