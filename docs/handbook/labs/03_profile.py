"""Lab 03 (profile) — why the hardware idles: one decode step under torch.profiler.

Smallest working piece: `torch.profiler.profile` around one `LLMEngine.step()` of 4 sequences decoding.
The operators' own time (the "kernels": aten ops on a CPU, CUDA kernels on a GPU) is summed from the
profile. The rest of the step's wall time is attributed, not assumed: the lab marks the engine's phases
(scheduler, runner, output processing, commit) with `torch.profiler.record_function`, so the profile
itself says how much of each phase ran outside any operator (the runner's is building the step's inputs
and the Python between its operators). The profiler slows what it watches (the observer effect), so the
step is also timed without it, several times, and both are shown.
On a CPU the engine runs its default path here, the one `inferlab serve` runs (a decode step of 4 is one
C++ call per layer): each of the project's C++ kernels is a named profiler region (`inferlab::decode_layer`,
`inferlab::linear`, `inferlab::attention_decode`, ...; kernels/csrc/common.h's PROFILE), so its time is
counted inside the operators, not as Python. Writes a Chrome / Perfetto trace (open it at https://ui.perfetto.dev or chrome://tracing).

    python docs/handbook/labs/03_profile.py [--model DIR] [--device cuda] [--out FILE]

On a CUDA device the lab profiles the step twice, with CUDA graphs off (`enforce_eager=True`) and on,
so the launch overhead the graphs remove shows in the same table.
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from reference_engine.config import EngineConfig
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.sampling_params import SamplingParams
from reference_engine.engine.trace import resolve_model

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
    eng = LLMEngine(EngineConfig(model=model, device=args.device, kv_cache_tokens=1024, enforce_eager=eager))
    for i in range(4):
        eng.add_request(list(range(10 + i, 42 + i)), SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    for _ in range(3):  # prefill, then two decode steps: caches and buffers are warm
        eng.step()
    return eng


PHASES = {"scheduler": ("scheduler", "schedule"), "runner": ("runner", "run"),
          "output processing": ("outputs", "process"), "commit": ("scheduler", "update_from_output")}


def annotate(eng: LLMEngine) -> None:
    """Wrap each phase's method of this engine in a profiler range named "lab: <phase>"."""
    for label, (owner, name) in PHASES.items():
        obj = getattr(eng, owner)
        fn = getattr(obj, name)

        def wrapped(*a, _fn=fn, _label=label, **k):
            with record_function(f"lab: {_label}"):
                return _fn(*a, **k)
        setattr(obj, name, wrapped)


def phases(events, cuda: bool) -> dict[str, list[float]]:
    """phase -> [its wall seconds, seconds inside operators (kernels on CUDA) under it], from the profile's
    events: every operator is charged to the "lab: ..." range that encloses it ("(no phase)" if none)."""
    out: dict[str, list[float]] = {}
    for e in events:
        if e.name.startswith("lab: "):
            out.setdefault(e.name[5:], [0.0, 0.0])[0] += e.cpu_time_total / 1e6
            continue
        inside = (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e6
        if not inside:
            continue
        parent = e.cpu_parent
        while parent is not None and not parent.name.startswith("lab: "):
            parent = parent.cpu_parent
        out.setdefault(parent.name[5:] if parent else "(no phase)", [0.0, 0.0])[1] += inside
    return out


def verdict(wall: float, cpu: float, inside: float, cuda: bool = False, waited: float = 1.5) -> str:
    """The lab's reading of the split, from the step's numbers alone."""
    if not cuda and wall > waited * cpu:  # the process waited for a core: other work shares this machine
        return (f"inconclusive on this machine: the step took {wall * 1e3:.2f} ms of wall time but only {cpu * 1e3:.2f} ms "
                f"of this process's CPU time, so it spent time waiting for a core; run it again on a quiet machine "
                f"before reading the split")
    what = "kernels" if cuda else "operators"
    if wall - inside > inside:
        return f"overhead-bound: {(wall - inside) / wall:.0%} of the step is spent outside the {what}"
    return f"{what}-bound: {inside / wall:.0%} of the step is spent inside the {what}"


def sync() -> None:
    if cuda:
        torch.cuda.synchronize()


def one(eager: bool, out: str) -> dict:
    eng = engine_mid_decode(eager)
    annotate(eng)
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
    ops = [e for e in ev if not e.key.startswith("lab: ")]  # the phase ranges are ours, not operators
    if cuda:  # device time: what the GPU spent in kernels during the step
        kernels = sum(e.self_device_time_total for e in ops) / 1e6
        calls = sum(e.count for e in ops if e.self_device_time_total > 0)
    else:  # every dispatcher op's and inferlab:: kernel region's self time: its C++ work, children excluded
        kernels = sum(e.self_cpu_time_total for e in ops) / 1e6
        calls = sum(e.count for e in ops)
    print(ev.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=8, max_name_column_width=28))
    return {"attempts": attempt + 1, "wall": wall, "cpu": cpu, "plain": statistics.median(plain), "plain_lo": min(plain), "plain_hi": max(plain),
            "kernels": kernels, "calls": calls, "phases": phases(prof.events(), cuda)}


runs = {"eager": one(True, args.out)}
if cuda:
    runs["CUDA graphs"] = one(False, args.out.replace(".json", "_graphs.json"))
for name, r in runs.items():
    other = r["wall"] - r["kernels"]
    what = "kernels" if cuda else "operators"
    print(f"{name}: one decode step of 4 sequences: {r['wall'] * 1e3:.2f} ms under the profiler "
          f"({r['plain'] * 1e3:.2f} ms median without it, range {r['plain_lo'] * 1e3:.2f}-{r['plain_hi'] * 1e3:.2f}); "
          f"{r['calls']} {'kernel launches' if cuda else 'operator calls'}; "
          f"inside the {what} {r['kernels'] * 1e3:.2f} ms = {r['kernels'] / r['wall']:.0%}, "
          f"outside them {other * 1e3:.2f} ms = {other / r['wall']:.0%}")
    ph = r["phases"]
    marked = sum(w for w, _ in ph.values())
    parts = [f"{k} {(w - i) * 1e3:.2f} ms" for k, (w, i) in sorted(ph.items(), key=lambda kv: kv[1][1] - kv[1][0]) if k != "(no phase)"]
    loose = ph.get("(no phase)", [0.0, 0.0])[1]
    print(f"  outside the {what}, by phase (from the profile's ranges): " + ", ".join(parts)
          + f"; the step's own code around the phases {(r['wall'] - marked - loose) * 1e3:.2f} ms")
    print(f"  {verdict(r['wall'], r['cpu'], r['kernels'], cuda)}")
print(f"Chrome trace written to {args.out}" + (" and its _graphs twin" if cuda else ""))
