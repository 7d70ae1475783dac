"""Energy counters: RAPL on a planted powercap tree (these VMs have none), its wrap, its unreadable case;
NVML's counter where a GPU is present (skipped here, run on a GPU host)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from experiments.measuring import energy


def plant(root: Path, domains: dict[str, tuple[str, int, int]]) -> Path:
    """powercap/intel-rapl:<id>/{name, energy_uj, max_energy_range_uj}, as the kernel lays them out."""
    for zone, (name, uj, span) in domains.items():
        d = root / f"intel-rapl:{zone}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "name").write_text(name + "\n")
        (d / "energy_uj").write_text(f"{uj}\n")
        (d / "max_energy_range_uj").write_text(f"{span}\n")
    return root


def set_uj(root: Path, zone: str, uj: int) -> None:
    (root / f"intel-rapl:{zone}" / "energy_uj").write_text(f"{uj}\n")


def test_rapl_sums_the_package_domains_and_not_their_subzones(tmp_path):
    root = plant(tmp_path, {"0": ("package-0", 1_000_000, 262_143_328_850), "1": ("package-1", 5_000_000, 262_143_328_850),
                            "0:0": ("core", 900_000, 262_143_328_850), "0:1": ("dram", 10, 65_712_999_613)})
    m = energy.meter(root)
    assert isinstance(m, energy.Rapl) and [d.name for d in m.domains] == ["intel-rapl:0", "intel-rapl:1"]
    assert "package-0, package-1" in m.source and "whole socket" in m.scope and "load client" in m.scope
    a = m.read()
    set_uj(root, "0", 3_500_000)  # +2.5 J
    set_uj(root, "1", 5_500_000)  # +0.5 J
    set_uj(root, "0:0", 9_000_000)  # a subzone is part of its package: never added twice
    assert m.used(a, m.read()) == pytest.approx(3.0)


def test_a_counter_that_wrapped_counts_once_across_the_wrap(tmp_path):
    span = 262_143_328_850  # µJ, the range a real package reports
    root = plant(tmp_path, {"0": ("package-0", span - 1_000_000, span)})
    m = energy.Rapl(root)
    a = m.read()
    set_uj(root, "0", 2_000_000)  # passed the top: 1 J to the wrap, 2 J after it
    assert m.used(a, m.read()) == pytest.approx(3.0)


def test_a_counter_without_a_range_that_goes_down_is_an_error_not_a_guess():
    a, b = energy.Reading({"gpu0": 10.0}, {"gpu0": None}), energy.Reading({"gpu0": 4.0}, {"gpu0": None})
    with pytest.raises(ValueError, match="went down"):
        energy.Meter.used(a, b)


def test_no_readable_counter_means_no_meter(tmp_path):
    assert energy.meter(tmp_path / "absent") is None
    root = plant(tmp_path / "p", {"0": ("package-0", 1, 10)})
    (root / "intel-rapl:0" / "energy_uj").unlink()  # root-only on recent kernels: unreadable here
    assert energy.meter(root) is None
    assert energy.NOT_REPORTED == "not reported by this machine"


def test_nvml_total_energy_where_a_gpu_is_present():
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is the gpu extra")
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no NVIDIA GPU on this machine")
    pynvml.nvmlInit()
    m = energy.Nvml(pynvml)
    a = m.read()
    import torch

    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(50):
        x = x @ x / 64
    torch.cuda.synchronize()
    b = m.read()
    assert a is not None and b is not None and "nvmlDeviceGetTotalEnergyConsumption" in m.source
    assert m.used(a, b) > 0  # joules, from the counter, over real work
