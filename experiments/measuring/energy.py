"""Energy a level used, read from the device's own cumulative counter at the level's start and its end.

- NVIDIA GPUs: NVML's total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`, millijoules since the
  driver loaded; `nvidia-ml-py`, the `gpu` extra), summed over the GPUs this process sees
  (`CUDA_VISIBLE_DEVICES`, else all). A counter, not power samples: on recent GPUs a power sample
  averages only part of its interval, so integrating samples undercounts. The engine's process is
  never touched: NVML is read from the harness.
- CPUs: RAPL's package domains (`/sys/class/powercap/intel-rapl:N`, named `package-N`; AMD's Zen
  exposes the same interface), `energy_uj` in microjoules, which wraps to 0 past
  `max_energy_range_uj`: a reading is taken at each end of a level, and a smaller second one means
  one wrap (a level shorter than a wrap period, minutes at a socket's power). It is the whole
  socket's energy, the load client's and everything else's included, and says so.
- Neither readable: `meter()` is None and the report says "not reported by this machine". Energy is
  never estimated.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POWERCAP = Path("/sys/class/powercap")
NOT_REPORTED = "not reported by this machine"


@dataclass
class Reading:
    """One read of every domain's counter, in joules, and each domain's wrap range (None: it never wraps)."""

    joules: dict[str, float]
    ranges: dict[str, float | None] = field(default_factory=dict)


class Meter:
    """A device's cumulative energy counter: `read()` at a level's start and end, `used(a, b)` the joules
    between them. `source` names the counter; `scope` says whose energy it is."""

    source = ""
    scope = ""

    def read(self) -> Reading | None:
        raise NotImplementedError

    @staticmethod
    def used(a: Reading, b: Reading) -> float:
        """Joules between two readings, summed over domains; a domain whose counter went down wrapped once."""
        total = 0.0
        for k, end in b.joules.items():
            start, span = a.joules.get(k), b.ranges.get(k)
            if start is None:
                continue
            d = end - start
            if d < 0:
                if not span:
                    raise ValueError(f"energy counter {k} went down ({start} -> {end} J) and has no wrap range")
                d += span
            total += d
        return total

    def describe(self) -> dict[str, str]:
        return {"source": self.source, "scope": self.scope}


class Rapl(Meter):
    """RAPL package domains under a powercap tree (a planted folder in tests)."""

    def __init__(self, root: Path = POWERCAP):
        self.domains = sorted(d for d in root.glob("intel-rapl:*") if d.name.count(":") == 1
                              and (d / "name").is_file() and (d / "name").read_text().strip().startswith("package"))
        names = ", ".join((d / "name").read_text().strip() for d in self.domains)
        self.source = f"RAPL energy_uj ({root}: {names})"
        self.scope = "the whole socket (every process on it, the load client included)"

    def read(self) -> Reading | None:
        try:
            joules = {d.name: int((d / "energy_uj").read_text()) / 1e6 for d in self.domains}
            ranges = {d.name: int((d / "max_energy_range_uj").read_text()) / 1e6
                      if (d / "max_energy_range_uj").is_file() else None for d in self.domains}
        except (OSError, ValueError):  # unreadable (root-only since CVE-2020-8694) or gone
            return None
        return Reading(joules, ranges)


class Nvml(Meter):
    """NVML's total-energy counter of the GPUs this process sees."""

    def __init__(self, nvml: Any):
        self.nvml = nvml
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        count = nvml.nvmlDeviceGetCount()
        index = [int(i) for i in visible.split(",") if i.strip().isdigit()] if visible else list(range(count))
        self.handles = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in index if i < count}
        names = {nvml.nvmlDeviceGetName(h) for h in self.handles.values()}
        names = {n.decode() if isinstance(n, bytes) else n for n in names}
        self.source = f"NVML nvmlDeviceGetTotalEnergyConsumption ({len(self.handles)} x {', '.join(sorted(names))})"
        self.scope = f"GPU {', '.join(map(str, self.handles))} (the GPUs this process sees; idle ones included)"

    def read(self) -> Reading | None:
        try:
            mj = {str(i): self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for i, h in self.handles.items()}
        except Exception:  # noqa: BLE001 - NVML errors are its own class hierarchy; unreadable means no reading
            return None
        return Reading({k: v / 1e3 for k, v in mj.items()}, {k: None for k in mj})


def meter(powercap: Path = POWERCAP) -> Meter | None:
    """NVML where a GPU and nvidia-ml-py are here, else RAPL where a package domain reads, else None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() > 0:
            m = Nvml(pynvml)
            if m.handles and m.read() is not None:
                return m
    except Exception:  # noqa: BLE001 - no driver, no library, no GPU: try the CPU's counter
        pass
    rapl = Rapl(powercap) if powercap.is_dir() else None
    return rapl if rapl is not None and rapl.domains and rapl.read() is not None else None
