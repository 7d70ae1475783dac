"""Lab 14 (profile) — why the hardware idles: one decode step under torch.profiler.

Smallest working piece: `torch.profiler.profile` around one `LLMEngine.step()` of 4 sequences decoding.
The operators' own time (the "kernels": aten ops on a CPU, CUDA kernels on a GPU) is summed from the
profile; whatever else the step's wall time holds is Python: the scheduler, building the step's inputs,
the sampler's bookkeeping, output processing, and launching each operator. The profiler slows what it
watches (the observer effect), so the step is also timed without it, several times, and both are shown.
On a CPU the engine runs its PyTorch backends here (`attention_backend="torch"`, no C++ fused ops):
the project's own C++ kernels are called through pybind, not PyTorch's dispatcher, so the profiler
would not see them and their time would be counted as Python. Writes a Chrome / Perfetto trace (open it at https://ui.perfetto.dev or chrome://tracing).

    python docs/handbook/labs/14_profile.py [--model DIR] [--device cuda] [--out FILE]

On a CUDA device the lab profiles the step twice, with CUDA graphs off (`enforce_eager=True`) and on,
so the launch overhead the graphs remove shows in the same table.
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine
from reference_engine.sampling_params import SamplingParams
from reference_engine.trace import resolve_model

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
ap.add_argument("--device", default="cpu")
ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "inferlab-decode-step.json"),
                help="Chrome trace file (default %(default)s)")
args = ap.parse_args()
model = resolve_model(args.model)
cuda = args.device.startswith("cuda")


def engine_mid_decode(eager: bool) -> LLMEngine:
    """4 sequences past their prefill, so the next step is a pure decode step."""
    backends = {} if cuda else {"attention_backend": "torch", "fused_ops": False}  # every op visible to the profiler
    eng = LLMEngine(EngineConfig(model=model, device=args.device, kv_cache_tokens=1024, enforce_eager=eager, **backends))
    for i in range(4):
        eng.add_request(list(range(10 + i, 42 + i)), SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    for _ in range(3):  # prefill, then two decode steps: caches and buffers are warm
        eng.step()
    return eng


def sync() -> None:
    if cuda:
        torch.cuda.synchronize()


def one(eager: bool, out: str) -> dict:
    eng = engine_mid_decode(eager)
    plain = []
    for _ in range(5):  # the same step without the profiler: the observer's cost is the difference
        sync()
        t0 = time.perf_counter()
        eng.step()
        sync()
        plain.append(time.perf_counter() - t0)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for attempt in range(5):  # keep the first profiled step that did not wait for a core (wall ~ CPU time)
        with profile(activities=acts) as prof:
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            eng.step()
            sync()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if cuda or wall <= 1.5 * cpu:
            break
    prof.export_chrome_trace(out)
    ev = prof.key_averages()
    if cuda:  # device time: what the GPU spent in kernels during the step
        kernels = sum(e.self_device_time_total for e in ev) / 1e6
        calls = sum(e.count for e in ev if e.self_device_time_total > 0)
    else:  # every dispatcher op's self time (aten::, mkldnn::, ...): its C++ work, children excluded
        kernels = sum(e.self_cpu_time_total for e in ev) / 1e6
        calls = sum(e.count for e in ev)
    print(ev.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=8, max_name_column_width=28))
    return {"attempts": attempt + 1, "wall": wall, "cpu": cpu, "plain": statistics.median(plain), "plain_lo": min(plain), "plain_hi": max(plain),
            "kernels": kernels, "calls": calls}


runs = {"eager": one(True, args.out)}
if cuda:
    runs["CUDA graphs"] = one(False, args.out.replace(".json", "_graphs.json"))
for name, r in runs.items():
    other = r["wall"] - r["kernels"]
    print(f"{name}: one decode step of 4 sequences: {r['wall'] * 1e3:.2f} ms under the profiler "
          f"({r['plain'] * 1e3:.2f} ms median without it, range {r['plain_lo'] * 1e3:.2f}-{r['plain_hi'] * 1e3:.2f}); "
          f"{r['calls']} {'kernel launches' if cuda else 'operator calls'}; "
          f"{'kernels' if cuda else 'inside the operators'} {r['kernels'] * 1e3:.2f} ms = {r['kernels'] / r['wall']:.0%}, "
          f"everything else (Python, scheduling, launches) {other * 1e3:.2f} ms = {other / r['wall']:.0%}")
    if not cuda and r["wall"] > 1.5 * r["cpu"]:  # the process waited for a core: other work shares this machine
        print(f"  inconclusive on this machine ({r['attempts']} profiled steps tried): the step took {r['wall'] * 1e3:.2f} ms of wall time but only "
              f"{r['cpu'] * 1e3:.2f} ms of this process's CPU time, so it spent time waiting for a core; run it again "
              f"on a quiet machine before reading the split")
print(f"Chrome trace written to {args.out}" + (" and its _graphs twin" if cuda else ""))
