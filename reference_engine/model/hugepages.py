"""Host memory on 2 MiB pages for what a CPU step streams: the weight panels and the KV cache.

A SmolLM2 fp32 decode step reads all 538 MB of projection panels once. On 4 KiB pages that is 131k
pages: a TLB miss every 4 KiB, and the hardware prefetchers stop at every page boundary. Linux backs
anonymous memory with 2 MiB pages (transparent huge pages) where asked, `madvise(MADV_HUGEPAGE)`, in the
common default THP mode "madvise" (/sys/kernel/mm/transparent_hugepage/enabled). torch's CPU allocator
asks only under THP_MEM_ALLOC_ENABLE=1, off by default (vLLM-CPU does not set it). On this project's
Zen 4 VM the one-row decode step went from 22-25 ms to 13-20 ms (docs/perf/2026-12-05-hugepages.md).

`Arena(nbytes)` maps one private anonymous region, 2 MiB aligned, asks for huge pages, and hands out
64-byte-aligned tensors from it (`take`); a tensor keeps the region alive. Where there is no THP (mode
"never", not Linux) or INFERLAB_HUGEPAGES=0, the region is ordinary memory and nothing changes but the
alignment. Its pages are the kernel's zero pages until written, as torch.zeros' are after the write.

Memory: the region is the panels' bytes rounded up to 2 MiB, plus 64-byte alignment per tensor.
"""
from __future__ import annotations

import mmap
import os

import torch

HUGE = 2 << 20  # bytes in a huge page (x86-64)
ALIGN = 64  # a cache line: every tensor taken starts on one


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


def size(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes an `Arena` gives a tensor of this shape (its elements, rounded up to the alignment)."""
    n = 1
    for d in shape:
        n *= d
    return _up(n * torch.empty((), dtype=dtype).element_size(), ALIGN)


def enabled() -> bool:
    """Ask for huge pages unless INFERLAB_HUGEPAGES=0 (the A/B of scripts/hugepages_ab.py, removed after
    commit f9c2189; a host where khugepaged's compaction stalls hurt more than 4 KiB pages do)."""
    return os.environ.get("INFERLAB_HUGEPAGES", "1") != "0"


class Arena:
    """One 2 MiB-aligned anonymous mapping with MADV_HUGEPAGE, carved into tensors in order.

    Invariant: every tensor `take` returns lies inside the region, starts on a 64-byte boundary and
    overlaps no other; the region is unmapped when the arena and all of them are gone."""

    def __init__(self, nbytes: int):
        self.nbytes = _up(max(nbytes, 1), HUGE)
        # private: a shared anonymous map is shmem, which THP leaves alone; + HUGE to align the start
        self._map = mmap.mmap(-1, self.nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE") and enabled():  # Linux; elsewhere plain pages
            self._map.madvise(mmap.MADV_HUGEPAGE)
        raw = torch.frombuffer(self._map, dtype=torch.uint8)  # holds a reference to the mapping
        skip = -raw.data_ptr() % HUGE
        self.region = raw[skip:skip + self.nbytes]
        self.used = 0

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A fresh tensor of `shape`/`dtype` from the region (zeros until written)."""
        n = size(shape, dtype)
        if self.used + n > self.nbytes:
            raise ValueError(f"arena of {self.nbytes} bytes has {self.nbytes - self.used} left, {n} asked")
        elem = torch.empty((), dtype=dtype).element_size()
        count = 1
        for d in shape:
            count *= d
        out = self.region[self.used:self.used + count * elem].view(dtype).view(shape)
        self.used += n
        return out


def _vmas() -> list[tuple[int, int, str, int]]:
    """This process's mappings from /proc/self/smaps: (start, end, VmFlags, AnonHugePages bytes)."""
    out, cur = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):  # "start-end perms ...": a new mapping
                lo, hi = (int(x, 16) for x in head.split("-"))
                cur = [lo, hi, "", 0]
                out.append(cur)
            elif head == "AnonHugePages:":
                cur[3] = int(line.split()[1]) * 1024
            elif head == "VmFlags:":
                cur[2] = line.split(None, 1)[1].strip()
    return [tuple(v) for v in out]


def residency(tensors: list[torch.Tensor]) -> dict[str, int] | None:
    """Of the mappings holding these tensors: bytes mapped ("mapped"), bytes of them advised for huge
    pages ("advised": VmFlags "hg"), and bytes resident on 2 MiB pages ("huge": AnonHugePages). What
    `effective_config()["huge_pages"]` reports; None where there is no /proc (not Linux)."""
    try:
        vmas = _vmas()
    except OSError:
        return None
    seen: dict[int, tuple[int, int, str, int]] = {}
    for t in tensors:
        p = t.data_ptr()
        for v in vmas:
            if v[0] <= p < v[1]:
                seen[v[0]] = v
                break
    return {"mapped": sum(v[1] - v[0] for v in seen.values()),
            "advised": sum(v[1] - v[0] for v in seen.values() if "hg" in v[2].split()),
            "huge": sum(v[3] for v in seen.values())}


def huge_bytes(pid: int | str = "self") -> int | None:
    """AnonHugePages of a process (bytes on 2 MiB pages), from /proc; None where there is no /proc."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return 0
