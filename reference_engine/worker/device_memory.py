"""What a device has free, read where it is kept: free RAM for the CPU (`free_ram`: MemAvailable, or the
cgroup's headroom where that is lower), and `torch.cuda` and NVML readings for a CUDA device
(`DeviceMemory`). The memory plan (`memory_plan.py`) is checked against these; the memory split reports
the CUDA ones.

Sources: `torch.cuda` (`mem_get_info`: the device's free and total bytes; `memory_allocated` /
`max_memory_allocated` / `memory_reserved`: torch's caching allocator); NVML through nvidia-ml-py
(`pynvml`: the device's used bytes and this process's, as nvidia-smi shows them), when it is installed.
Off CUDA `DeviceMemory` reads nothing, never a guess.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

CGROUP = Path("/sys/fs/cgroup")


def _meminfo(key: str, path: str = "/proc/meminfo") -> int | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cgroup_headroom(root: Path = CGROUP) -> int | None:
    """Bytes the cgroup may still take (v2 memory.max, or v1 memory.limit_in_bytes, minus usage, plus the
    inactive file pages it would reclaim first); None without a limit."""
    for limit_f, usage_f, stat_f, inactive in (("memory.max", "memory.current", "memory.stat", "inactive_file"),
                                              ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes",
                                               "memory/memory.stat", "total_inactive_file")):
        try:
            limit = (root / limit_f).read_text().strip()
            usage = int((root / usage_f).read_text())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "no limit" as ~2^63
            return None
        stat = dict(line.split() for line in (root / stat_f).read_text().splitlines() if " " in line)
        return int(limit) - usage + int(stat.get(inactive, 0))
    return None


def free_ram() -> tuple[int | None, str]:
    """(free RAM in bytes, where read): the lower of MemAvailable and the cgroup's headroom; (None, why) off Linux."""
    mem, cg = _meminfo("MemAvailable"), cgroup_headroom()
    if cg is not None and (mem is None or cg < mem):
        return cg, "the cgroup's memory limit"
    return (mem, "MemAvailable") if mem is not None else (None, "no /proc/meminfo")


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
        self.start = self.snapshot()  # the device when this reader was made (the runner: before loading)

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
