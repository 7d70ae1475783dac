"""Where the engine core's memory goes under the soak's mix: the engine in this process, no server.

Drives `LLMEngine` (the soak's settings: prefix caching, n-gram speculation, max_model_len 1024, 16,384
KV tokens, 1 thread) with the soak's request mix (experiments/soak/mix.py: invalid requests skipped,
cut streams aborted after their token count, n = 2 as two requests) at `--rate` req/s of Poisson
arrivals, and writes one CSV row per step: RSS and glibc's heap (mallinfo2: `arena` bytes from the
kernel, `used` in malloc'd blocks, `free` kept for reuse, `top` trimmable at the top). Every minute it
prints Python's object counts that grew (gc), and the length of every container the engine, its
scheduler and output processor hold. A leak of Python objects shows in the counts; a native one as
`used` growing with no live request; allocator high-water as `free` growing with `used` flat.

    python scripts/soak_core_heap.py [--minutes 7] [--rate 1.5] [--bound] [--out heap.csv]

`--bound` applies the engine core's GEMM-cache bound first (engine_core.bound_gemm_caches), as the
server's core does. Findings: docs/perf/2026-12-04-soak-3.md.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.soak.load import timeline  # noqa: E402
from experiments.soak.mix import Mix  # noqa: E402
from reference_engine.config import EngineConfig  # noqa: E402
from reference_engine.sampling_params import SamplingParams  # noqa: E402


class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


LIBC = ctypes.CDLL("libc.so.6")
LIBC.mallinfo2.restype = Info


def heap() -> dict[str, float]:
    m, mib = LIBC.mallinfo2(), 2.0 ** 20
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * 4096 / mib
    return {"rss": rss, "arena": m.arena / mib, "used": (m.uordblks + m.hblkhd) / mib, "free": m.fordblks / mib,
            "top": m.keepcost / mib}


def containers(core) -> dict[str, int]:
    """len() of every dict/list/set/deque attribute of the engine's parts (one level down the scheduler)."""
    parts = {"core": core, "sched": core.scheduler, "outputs": core.outputs, "runner": core.runner}
    parts |= {f"sched.{k}": v for k, v in vars(core.scheduler).items() if hasattr(v, "__dict__")}
    return {f"{n}.{k}": len(v) for n, o in parts.items() for k, v in vars(o).items()
            if isinstance(v, (dict, list, set, collections.deque))}


def params(body: dict, i: int) -> SamplingParams:
    return SamplingParams(max_tokens=body["max_tokens"], temperature=body.get("temperature", 1.0),
                          top_p=body.get("top_p", 1.0), seed=body["seed"] + i if "seed" in body else None,
                          logprobs=body.get("top_logprobs") if body.get("logprobs") else None)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="models/smollm2-135m-instruct")
    p.add_argument("--minutes", type=float, default=7.0)
    p.add_argument("--rate", type=float, default=1.5)
    p.add_argument("--bound", action="store_true")
    p.add_argument("--out", type=Path, default=Path("heap.csv"))
    args = p.parse_args(argv)
    if args.bound:
        from reference_engine.engine.engine_core import bound_gemm_caches
        print(bound_gemm_caches(), flush=True)
    from reference_engine.engine.llm_engine import LLMEngine

    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    core = LLMEngine(EngineConfig(model=args.model, max_model_len=1024, kv_cache_tokens=16384, num_threads=1,
                                  enable_prefix_caching=True, speculative_config=spec))
    gc.collect()
    gc.freeze()  # as the server's core does
    mix, base = Mix(args.model, "x", 1024, 0), collections.Counter(type(o).__name__ for o in gc.get_objects())
    tok, live, step = mix.chat_tok, {}, 0
    arrivals = collections.deque(timeline(args.rate, args.minutes * 60, 300.0, seed=0))
    t0 = report = time.monotonic()
    with args.out.open("w") as out:
        out.write("t,step,rss,arena,used,free,top,running,waiting\n")
        while arrivals or core.has_unfinished():
            now = time.monotonic() - t0
            while arrivals and arrivals[0][0] <= now:
                req = mix.make(arrivals.popleft()[1])
                if req.kind == "invalid":
                    continue
                text = tok.apply_chat_template(req.body["messages"], add_generation_prompt=True)
                ids = tok.encode(text, add_special_tokens=False)
                for i in range(req.body.get("n", 1)):
                    live[core.add_request(ids, params(req.body, i))] = [req, [], req.cut_after if i == 0 else None]
            if not core.has_unfinished():
                time.sleep(0.01)
                continue
            step += 1
            for d in core.step():
                st = live.get(d.request_id)
                if st is None:
                    continue
                st[1] += d.new_token_ids
                if d.finished:
                    live.pop(d.request_id)
                    mix.done(st[0], tok.decode(st[1]) if d.finish_reason != "abort" else None)
                elif st[2] is not None and len(st[1]) >= st[2]:
                    core.abort(d.request_id)
                    live.pop(d.request_id)
            h = heap()
            out.write(f"{now:.2f},{step}," + ",".join(f"{h[k]:.2f}" for k in ("rss", "arena", "used", "free", "top"))
                      + f",{len(core.scheduler.running)},{len(core.scheduler.waiting)}\n")
            if time.monotonic() - report > 60 or not (arrivals or core.has_unfinished()):
                report = time.monotonic()
                gc.collect()
                grew = {k: v - base[k] for k, v in collections.Counter(type(o).__name__ for o in gc.get_objects()).items()
                        if v - base[k] > 20}
                print(json.dumps({"t": round(now), "step": step, "live": len(live), **{k: round(v, 1) for k, v in h.items()},
                                  "objects_grew": grew, "containers": containers(core)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
