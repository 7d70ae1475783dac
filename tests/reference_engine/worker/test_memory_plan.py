"""The memory plan on CPU: the KV budget arithmetic (gpu_memory_utilization) with made-up device numbers,
its wiring in the runner with a fake CUDA memory reader, the engine's memory report and effective settings
(the dicts adapters copy into EngineInfo), all read from the runner's one plan; the device readings (NVML)
and the CPU heap policy."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

from reference_engine import LLM, EngineConfig, SamplingParams
from reference_engine.worker import model_runner
from reference_engine.worker.device_memory import DeviceMemory, Snapshot
from reference_engine.worker.memory_plan import kv_budget, param_bytes, weight_counts

GiB = 1 << 30
MiB = 1 << 20
# The harness's keys (adapters/base.py EngineInfo.effective / .memory)
EFFECTIVE_KEYS = {"dtype", "kv_capacity_tokens", "kv_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                  "max_model_len", "chunked_prefill", "prefix_caching", "cuda_graphs", "compile", "speculative",
                  "tensor_parallel_size"}


def test_kv_budget_is_vllms_rule():
    # 80 GiB device, 90 %: 72 GiB for the engine; weights 16 + activations 2 + non-torch 1 + graphs 2
    assert kv_budget(0.9, 80 * GiB, 79 * GiB, 16 * GiB, 2 * GiB, 1 * GiB, 2 * GiB) == 51 * GiB
    assert kv_budget(0.5, 80 * GiB, 79 * GiB, 16 * GiB, 2 * GiB, 1 * GiB) == 21 * GiB  # eager: no reserve


def test_kv_budget_errors_name_the_numbers():
    with pytest.raises(ValueError, match=r"asks for 72.00 GiB of 80.00 GiB, but only 40.00 GiB was free"):
        kv_budget(0.9, 80 * GiB, 40 * GiB, 16 * GiB, 2 * GiB, 1 * GiB)  # another process holds memory
    with pytest.raises(ValueError, match="leaves no room for the KV cache") as e:
        kv_budget(0.2, 80 * GiB, 79 * GiB, 16 * GiB, 2 * GiB, 1 * GiB)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kw, match", [
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": True}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 0.5}, "needs a CUDA device"),
    ({"gpu_memory_utilization": 0.5, "kv_cache_tokens": 100, "device": "cuda"}, "one KV budget"),
    ({"load_format": "pt"}, "load_format"),
])
def test_bad_memory_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig("m", **kw)


def test_device_memory_off_cuda_reads_nothing():
    m = DeviceMemory("cpu")
    assert m.start is None and m.snapshot() is None and m.free() is None and m.report() == {} and m.peak() == 0


def test_param_bytes_counts_tied_weights_once():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    assert param_bytes(emb, head) == 10 * 4 * 4
    assert param_bytes(emb, None) == 160


def test_engine_memory_report_and_effective_settings_on_cpu(tiny_llama):
    llm = LLM(str(tiny_llama), kv_cache_tokens=1024, block_size=16, max_num_seqs=4)
    e = llm.engine
    m = e.memory_report()
    from reference_engine.model import packed_linear
    layouts = packed_linear.layout_bytes(e.runner.model) if e.cfg.linear_backend == "onednn" else {}
    assert set(m) == {"weights", "kv_allocated", "kv_bytes_per_token", "kv_peak_used", "runtime_base",
                      "activation_peak"} | {f"layout_{k}" for k in layouts}  # no device readings
    assert all(m[f"layout_{k}"] == v > 0 for k, v in layouts.items())
    # before any weight: the interpreter, torch and the tokenizer. (No upper bound here: in a test process earlier
    # engines' freed heap is in it until the start-up trim; test_exp_memory_split checks it in fresh processes.)
    from reference_engine.worker.cpu_heap import rss
    assert m["runtime_base"] > 50 << 20
    per_tok = e.model_config.kv_bytes_per_token(torch.float32)
    assert m["kv_bytes_per_token"] == per_tok
    assert m["kv_allocated"] == 1024 * per_tok == sum(k.nbytes + v.nbytes for k, v in e.runner.kv_cache)
    # the parameters and buffers as held (rope tables, biases), each storage once; no layout
    held = {t.data_ptr(): t.nbytes for t in [*e.runner.model.parameters(), *e.runner.model.buffers()]}
    assert m["weights"] == sum(held.values())
    assert m["kv_peak_used"] == 0
    llm.generate([[10] * 40, [11] * 20], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    # both requests at their longest: ceil(49/16) + ceil(29/16) = 4 + 2 blocks
    assert e.memory_report()["kv_peak_used"] == 6 * 16 * per_tok
    e.reset_kv_peak()  # nothing running: back to 0
    assert e.memory_report()["kv_peak_used"] == 0
    # CPU: the activation peak is the RSS high-water since start-up: 256 MiB of fresh pages touched and freed now show
    import mmap
    now = rss()
    buf = mmap.mmap(-1, 256 << 20)
    for i in range(0, len(buf), 4096):
        buf[i] = 1
    buf.close()
    assert e.memory_report()["activation_peak"] >= now + (256 << 20) - e.runner.rss_at_start - (8 << 20)
    eff = e.effective_config()
    assert EFFECTIVE_KEYS <= set(eff)
    assert eff["weights_layouts"] == layouts
    count = weight_counts(e.model_config)[0]
    assert eff["bytes_per_weight"] == round((m["weights"] + sum(layouts.values())) / count, 3)
    assert eff["bytes_per_weight"] >= 4  # fp32: at least the parameters themselves
    assert eff["dtype"] == "float32" and eff["kv_capacity_tokens"] == 1024 and eff["kv_blocks"] == 64
    assert eff["cuda_graphs"] is False and eff["compile"] is False and eff["speculative"] is None
    from reference_engine.kernels import ops
    assert eff["attention_backend"] == ("cpu" if ops.available() else "torch")
    assert eff["tensor_parallel_size"] == 1


class FakeCuda(DeviceMemory):
    """A CUDA device's readings, made up: 10 GiB total, 9 GiB free at start; after loading and the
    profile forward 1 GiB less is free, of which torch's allocator holds 800 MiB (the rest: CUDA
    context and modules, 224 MiB); the profile forward peaks 300 MiB above what it started with."""

    def __init__(self, device):
        self.snaps = 0
        super().__init__(device)  # takes the first snapshot: `start`
        self.cuda = True

    def snapshot(self):
        self.snaps += 1
        if self.snaps == 1:
            return Snapshot(free=9 * GiB, total=10 * GiB, reserved=0)
        return Snapshot(free=8 * GiB, total=10 * GiB, reserved=800 * MiB)

    def reset_peak(self):
        pass

    def allocated(self):
        return 50 * MiB

    def peak(self):
        return 350 * MiB

    def empty_cache(self):
        pass

    def report(self):
        return {"device_total": 10 * GiB}


def test_runner_sizes_kv_from_gpu_memory_utilization(tiny_llama, monkeypatch):
    monkeypatch.setattr(model_runner, "DeviceMemory", FakeCuda)
    cfg = EngineConfig(str(tiny_llama), max_num_batched_tokens=80, max_model_len=32, block_size=16)
    # on "CUDA" (the config refuses it for a CPU device); 614 MiB, so that the KV tensors this CPU
    # runner really allocates stay under 100 MiB (at 0.5 it zeroed 4.5 GiB: 30 s of the suite)
    cfg.gpu_memory_utilization = 0.06
    r = model_runner.ModelRunner(cfg)
    p = r.plan
    assert p.activation_peak == 300 * MiB  # the profile ran: 80 tokens as 3 sequences of <= 32
    non_torch = 1 * GiB - 800 * MiB
    assert p.non_torch == non_torch and (p.free, p.total) == (9 * GiB, 10 * GiB) and p.graph_reserve == 0
    budget = int(0.06 * 10 * GiB) - p.weights - 300 * MiB - non_torch  # no graphs on this CPU runner: no reserve
    assert r.num_blocks == p.num_blocks == budget // (16 * p.kv_bytes_per_token)
    m = r.memory()
    assert m["activation_peak"] == 300 * MiB and m["device_total"] == 10 * GiB
    assert m["kv_allocated"] == p.kv_bytes == r.num_blocks * 16 * r.kv_bytes_per_token <= budget
    cfg.gpu_memory_utilization = 0.05  # 512 MiB: less than activations (300) + non-torch (224)
    with pytest.raises(ValueError, match="leaves no room"):
        model_runner.ModelRunner(cfg)


def test_dummy_weights_make_the_shape_without_reading_files(tiny_qwen3, tmp_path):
    import shutil

    d = tmp_path / "no-weights"
    shutil.copytree(tiny_qwen3, d)
    (d / "model.safetensors").unlink()
    from reference_engine.model.loader import dummy_model

    model, _ = dummy_model(str(d), torch.float32, torch.device("cpu"), 64)  # as made, before any layout
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as the config says
    w = model.model.layers[0].self_attn.qkv_proj.weight
    assert abs(float(w.detach().std()) - 0.02) < 0.002
    q_norm = model.model.layers[0].self_attn.q_norm.weight.detach()
    assert torch.equal(q_norm, torch.ones_like(q_norm))
    llm = LLM(str(d), load_format="dummy", kv_cache_tokens=256)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 3


class FakeNvml:
    """Stands in for nvidia-ml-py's `pynvml` (NVML needs a GPU): one device, three processes."""

    def __init__(self, fail: bool = False):
        self.inits, self.by = 0, []
        self.fail = fail

    def nvmlInit(self):
        self.inits += 1
        if self.fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.by.append(("uuid", uuid))
        return "handle"

    def nvmlDeviceGetHandleByIndex(self, index):
        self.by.append(("index", index))
        return "handle"

    def nvmlDeviceGetMemoryInfo(self, handle):
        assert handle == "handle"
        return type("Mem", (), {"used": 7 * GiB, "total": 141 * GiB, "free": 134 * GiB})()

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        proc = lambda pid, used: type("Proc", (), {"pid": pid, "usedGpuMemory": used})()  # noqa: E731
        return [proc(os.getpid(), 4 * GiB + 5), proc(os.getpid() + 1, 3 * GiB), proc(os.getpid() + 2, None)]


def no_device(monkeypatch):
    """A CUDA reader made without CUDA: its start snapshot reads nothing."""
    monkeypatch.setattr(DeviceMemory, "snapshot", lambda self: None)


def test_nvml_readings_are_reported(monkeypatch):
    no_device(monkeypatch)
    nv = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    props = type("Props", (), {"uuid": "1234-abcd"})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    m = DeviceMemory("cuda:0")
    assert m.nvml() == {"device_used": 7 * GiB, "process_used": 4 * GiB + 5}  # this pid's, not the others'
    assert m.nvml() == {"device_used": 7 * GiB, "process_used": 4 * GiB + 5}
    assert nv.inits == 1 and nv.by == [("uuid", "GPU-1234-abcd")]  # opened once, torch's device by UUID
    # report(): torch's readings (faked here: no CUDA on this machine) plus NVML's
    monkeypatch.setattr(m, "snapshot", lambda: Snapshot(free=100 * GiB, total=141 * GiB, reserved=9 * GiB))
    monkeypatch.setattr(m, "allocated", lambda: 8 * GiB)
    monkeypatch.setattr(m, "peak", lambda: 10 * GiB)
    assert m.report() == {"device_total": 141 * GiB, "device_free": 100 * GiB, "torch_allocated": 8 * GiB,
                          "torch_reserved": 9 * GiB, "torch_peak_allocated": 10 * GiB,
                          "device_used": 7 * GiB, "process_used": 4 * GiB + 5}


def test_nvml_falls_back_to_the_index_and_is_optional(monkeypatch):
    no_device(monkeypatch)
    nv = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)

    def no_uuid(device):
        raise RuntimeError("no CUDA")

    monkeypatch.setattr(torch.cuda, "get_device_properties", no_uuid)
    assert DeviceMemory("cuda:1").nvml()["device_used"] == 7 * GiB and nv.by == [("index", 1)]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fail=True))
    assert DeviceMemory("cuda:0").nvml() == {}  # NVML fails: no keys, never a guess
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed: import fails
    assert DeviceMemory("cuda:0").nvml() == {}


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_kept_cpu_heap_stops_page_faults_on_every_activation():
    """A 40 MiB temporary (a 4,096-token chunk's gate/up output is 48 MiB for SmolLM2) made and freed
    10 times: above glibc's largest mmap threshold each is a fresh mmap whose ~10,000 pages fault in
    again. After keep_freed_cpu_memory (and one warm-up round of 10, in which the heap grows: how
    many of those fault varies with the heap's layout, 1 to 4 rounds seen) the heap keeps them: at
    most a few of 10 rounds fault (0 or 1 seen). Run in a child: mallopt is per process."""
    code = """
import resource, torch
from reference_engine.worker.cpu_heap import keep_freed_cpu_memory
x = torch.ones(10 << 20)
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        (x + 1).sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults(), keep_freed_cpu_memory(), faults(), faults())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    default, applied, kept = int(out[0]), out[1], int(out[3])
    assert applied == "True"
    pages = (40 << 20) // 4096
    assert default >= 8 * pages and kept <= 3 * pages, (default, kept)
