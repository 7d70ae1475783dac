"""The RAM check at start (the memory plan's, `worker/memory_plan.py`): its arithmetic, where it reads free RAM,
that the plan it checks is the one the memory split and the effective settings read, and the refusal, before
any weight is loaded, through `LLMEngine`, `inferlab serve` and `inferlab run` (one line, exit 2) for a KV
budget far beyond this machine."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reference_engine.config import EngineConfig, ModelConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.model.llama import CausalLM
from reference_engine.worker import device_memory, memory_plan, model_runner
from reference_engine.worker.backends import with_default_backends
from reference_engine.worker.memory_plan import MemoryPlan, activation_estimate, refuse, weight_counts

REPO = Path(__file__).resolve().parents[3]
GiB = 1 << 30
HUGE = 1 << 50  # a KV budget of 1 PiB: beyond any machine this runs on


def test_check_adds_the_parts_and_names_them_in_gib():
    parts = {"parameters": 2 * GiB, "layouts": 4 * GiB, "KV cache": 3 * GiB, "activations (estimate)": GiB // 2}
    refuse(parts, int(9.5 * GiB), "MemAvailable")  # exactly enough: passes
    refuse(parts, None, "no /proc/meminfo")  # nothing to compare with: passes
    with pytest.raises(ValueError) as e:
        refuse(parts, 9 * GiB, "MemAvailable")
    msg = str(e.value)
    assert "\n" not in msg
    assert ("parameters 2.00 + layouts 4.00 + KV cache 3.00 + activations (estimate) 0.50 = 9.50 > 9.00 available "
            "(MemAvailable)") in msg


@pytest.mark.parametrize("v2", [True, False])
def test_cgroup_headroom_reads_the_limit_usage_and_reclaimable_pages(tmp_path, v2):
    d = tmp_path if v2 else tmp_path / "memory"
    d.mkdir(exist_ok=True)
    names = ("memory.max", "memory.current", "inactive_file") if v2 else \
        ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    (d / names[0]).write_text(f"{8 * GiB}\n")
    (d / names[1]).write_text(f"{6 * GiB}\n")
    (d / "memory.stat").write_text(f"anon 1\n{names[2]} {GiB}\n")
    assert device_memory.cgroup_headroom(tmp_path) == 3 * GiB
    (d / names[0]).write_text("max\n" if v2 else f"{(1 << 63) - 4096}\n")  # no limit
    assert device_memory.cgroup_headroom(tmp_path) is None
    assert device_memory.cgroup_headroom(tmp_path / "absent") is None


def test_free_ram_is_memavailable_or_a_lower_cgroup_headroom():
    avail, source = device_memory.free_ram()
    assert source in ("MemAvailable", "the cgroup's memory limit")
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemAvailable:"))) * 1024
    assert 0 < avail <= mem + (256 << 20)  # (read a moment apart)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_weight_counts_are_the_models_own(make_tiny, family):
    """The check's parameter count, from the config alone, equals the real model's (tied weights once);
    the projections `pack` swaps are every nn.Linear, the LM head included even when tied."""
    mcfg = ModelConfig.from_dir(make_tiny(family))
    model = CausalLM(mcfg, 64)
    params = sum(p.numel() for p in model.parameters())
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert weight_counts(mcfg) == (params, linears)


def test_plan_matches_what_the_engine_then_holds(tiny_llama):
    cfg = EngineConfig(model=str(tiny_llama), kv_cache_tokens=1024, max_num_seqs=4)
    plan = MemoryPlan.make(with_default_backends(cfg)).parts()
    e = LLMEngine(cfg)
    m = e.memory_report()
    rope = e.runner.model.rope
    assert plan["KV cache"] == m["kv_allocated"] == 1024 * e.model_config.kv_bytes_per_token(torch.float32)
    # everything held for weights, the parameters as held plus every layout (the rope tables are not weights)
    held = m["weights"] - rope.cos.nbytes - rope.sin.nbytes + sum(v for k, v in m.items() if k.startswith("layout_"))
    assert abs(plan["parameters"] + plan["layouts"] - held) <= 0.1 * held  # a probe of one shape: padding differs
    mc = e.model_config
    assert plan["activations (estimate)"] == activation_estimate(mc, cfg.max_num_batched_tokens, 4) > 0


def test_the_split_the_settings_and_the_check_read_one_plan(tiny_llama, monkeypatch):
    """The runner's plan is what the memory split and `/server_info` report, and what the check refuses."""
    cfg = EngineConfig(model=str(tiny_llama), kv_cache_tokens=512, max_num_seqs=4)
    e = LLMEngine(cfg)
    p, m, eff = e.runner.plan, e.memory_report(), e.effective_config()
    assert m["weights"] == p.weights and m["kv_allocated"] == p.kv_bytes == 512 * p.kv_bytes_per_token
    assert m["kv_bytes_per_token"] == p.kv_bytes_per_token and m["runtime_base"] == p.runtime_base
    assert {k.removeprefix("layout_"): v for k, v in m.items() if k.startswith("layout_")} == p.layouts
    assert eff["kv_capacity_tokens"] == p.num_blocks * cfg.block_size == 512 and eff["weights_layouts"] == p.layouts
    assert (p.dtype, p.max_model_len) == (e.runner.dtype, e.runner.max_model_len)
    assert p.free is not None and p.free_source in ("MemAvailable", "the cgroup's memory limit")
    # the same plan, short of free RAM by one byte: refused in one line, naming the plan's own parts
    with pytest.raises(ValueError, match=r"not enough memory to start \(GiB\): parameters") as err:
        refuse(p.parts(), sum(p.parts().values()) - 1, "a test")
    assert f"KV cache {p.kv_bytes / GiB:.2f}" in str(err.value)
    # a plan that does not fit is refused before any weight is loaded (or the KV cache allocated)
    monkeypatch.setattr(memory_plan, "free_ram", lambda: (GiB // 1024, "a test"))
    loaded = []
    monkeypatch.setattr(model_runner, "load_model", lambda *a, **k: loaded.append(a))
    monkeypatch.setattr(model_runner, "allocate_kv_cache", lambda *a, **k: loaded.append(a))
    with pytest.raises(ValueError, match=r"not enough memory to start \(GiB\): .* > 0.00 available \(a test\)"):
        LLMEngine(cfg)
    assert loaded == []


def test_the_engine_refuses_a_kv_budget_beyond_the_machine(tiny_llama):
    with pytest.raises(ValueError, match=r"not enough memory to start \(GiB\): parameters .* KV cache 1048576.00"):
        LLMEngine(EngineConfig(model=str(tiny_llama), kv_cache_bytes=HUGE))


def test_inferlab_serve_exits_2_with_one_line(tiny_llama):
    p = subprocess.run([sys.executable, "-m", "reference_engine.server", str(tiny_llama), "--port", "0",
                        "--kv-cache-bytes", str(HUGE)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "inferlab serve: not enough memory to start (GiB)" in p.stderr, p.stderr


def test_inferlab_run_exits_2_with_one_line(tmp_path, tiny_llama):
    """Refused when the adapter is built (whatever its mode: before it picks one), before any engine starts."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'name = "t"\nmodel = "{tiny_llama}"\nengine = "reference"\n[engine_options.reference]\n'
                   f'mode = "server"\nkv_cache_tokens = {HUGE // 1024}\n')
    p = subprocess.run([sys.executable, "-m", "experiments.cli", "run", str(cfg), "--out", str(tmp_path / "res")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not enough memory to start (GiB)" in p.stderr, p.stderr
    assert not (tmp_path / "res").exists()
