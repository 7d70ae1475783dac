"""Lab 18 — disaggregated prefill and decode: one engine prefills, another decodes, the KV blocks move between them.

Smallest working piece: two `LLMEngine`s on the tiny model, each with its own KV pool. The prefill instance runs a
prompt and stops after its first token; `pack` gathers the prompt's blocks of K and V through its block table into
one tensor (what a KV connector puts on the wire); the decode instance allocates blocks of its own, `unpack` writes
the tensor into them through its block table, and `admit_with_remote_kv` starts the request there with every prompt
token but the last already computed (vLLM recomputes the last one to sample the next token). Its greedy tokens must
equal a colocated engine's. Then the split is timed under one load (a few requests decoding while long prompts
arrive): a colocated engine on both cores, against a prefill instance pinned to one core feeding a decode instance
pinned to the other (two processes: one holds the colocated engine and the decode instance, switching its affinity
per round, the other the prefill instance); the verdict on the decodes' inter-token latency is computed from the
repeats' numbers.

    python docs/handbook/labs/18_disaggregate.py [--model DIR] [--full]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from reference_engine.config import EngineConfig
from reference_engine.core.request import Status
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.engine.trace import resolve_model
from reference_engine.sampling_params import SamplingParams

ap = argparse.ArgumentParser()
ap.add_argument("--model", help="model directory (default: models/tiny-llama, made if absent)")
ap.add_argument("--full", action="store_true", help="longer decodes, more and longer prompts, 5 repeats (tens of s)")
ap.add_argument("--role", choices=["colocated", "prefill", "decode"], help=argparse.SUPPRESS)  # a timed process
ap.add_argument("--sock", help=argparse.SUPPRESS)
ap.add_argument("--cores", help=argparse.SUPPRESS)
ap.add_argument("--load", help=argparse.SUPPRESS)
args = ap.parse_args()
GREEDY = dict(temperature=0.0, ignore_eos=True)


# ---- the pieces ---------------------------------------------------------------------------------------------------
def pack(kv_cache: list[tuple[torch.Tensor, torch.Tensor]], blocks: list[int]) -> torch.Tensor:
    """The blocks' K and V, every layer, gathered through a block table into one tensor
    (layers, 2, len(blocks), block_size, kv_heads, head_dim): what a connector sends."""
    idx = torch.tensor(blocks)
    return torch.stack([torch.stack((k[idx], v[idx])) for k, v in kv_cache])


def unpack(data: torch.Tensor, kv_cache: list[tuple[torch.Tensor, torch.Tensor]], blocks: list[int]) -> None:
    """Write `pack`'s tensor into another pool's blocks, through that pool's block table."""
    idx = torch.tensor(blocks)
    for (k, v), layer in zip(kv_cache, data):
        k[idx] = layer[0]
        v[idx] = layer[1]


def prefill_only(eng: LLMEngine, rid: str, prompt: list[int]):
    """The prefill instance: run the prompt until its first token. max_tokens=2 keeps the request (and its blocks)
    alive after that token, as vLLM's connector keeps a finished prefill's blocks until the decode side has read
    them (`request_finished` returning True); the caller aborts it once they are sent."""
    eng.add_request(prompt, SamplingParams(max_tokens=2, **GREEDY), request_id=rid)
    req = eng.requests[rid]
    while not req.output_token_ids:
        eng.step()
    return req


def admit_with_remote_kv(eng: LLMEngine, rid: str, prompt: list[int], params: SamplingParams,
                         data: torch.Tensor) -> list[int]:
    """The decode instance: admit a request whose prompt KV arrives from elsewhere. Its own KV-cache manager
    allocates the blocks (vLLM: the connector's `get_num_new_matched_tokens` reports the prompt as matched, the
    scheduler allocates, `start_load_kv` fills them), `unpack` fills them, and the request starts running with all
    prompt tokens but the last computed: that one is recomputed so that its logits sample the next token
    (vLLM's `Scheduler._update_waiting_for_remote_kv`). Returns the blocks it got."""
    eng.add_request(prompt, params, request_id=rid)
    sched, req = eng.scheduler, eng.requests[rid]
    if not sched.kv.allocate_slots(req, len(prompt)):
        raise RuntimeError(f"decode instance: no blocks for {rid}")
    unpack(data, eng.runner.kv_cache, req.block_table)
    sched.waiting.remove(req)
    req.status, req.num_computed_tokens = Status.RUNNING, len(prompt) - 1
    req.first_scheduled_time = time.monotonic()
    sched.running.append(req)
    return list(req.block_table)


def run_all(eng: LLMEngine) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    while eng.has_unfinished():
        for d in eng.step():
            out.setdefault(d.request_id, []).extend(d.new_token_ids)
    return out


# ---- the timed processes (--role) -----------------------------------------------------------------------------------
def pin(cores: set[int]) -> None:
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))


def say(obj) -> None:
    print(json.dumps(obj), flush=True)


def long_prompt(rnd: int, i: int, n: int) -> list[int]:
    return [(31 * t + 7 * i + 101 * rnd) % 8000 + 10 for t in range(n)]


def serve_round(eng: LLMEngine, load: dict, rnd: int, conn=None) -> dict:
    """One round on the engine that decodes: `residents` requests decode while the long prompts arrive. Colocated
    (conn None), the prompts are added to this engine at their arrival times and prefilled in its steps; on the
    decode instance they come from the prefill instance with their KV. Returns the residents' inter-token latencies
    and the arrivals' TTFT, in ms."""
    params = SamplingParams(max_tokens=1, **GREEDY)
    arrivals = [] if conn else [(i * load["period_s"], f"p{rnd}-{i}", long_prompt(rnd, i, load["prompt"]))
                                for i in range(load["arrivals"])]
    residents = {f"r{rnd}-{j}": [100 + 13 * j + 50 * rnd + t for t in range(16)] for j in range(load["residents"])}
    for rid, p in residents.items():
        eng.add_request(p, SamplingParams(max_tokens=load["tokens"], **GREEDY), request_id=rid)
    itl, ttft, last, arrived_at, admitted = [], [], {}, {}, 0
    t0 = time.perf_counter()
    while eng.has_unfinished() or arrivals or (conn and admitted < load["arrivals"]):
        while arrivals and arrivals[0][0] <= time.perf_counter() - t0:
            at, rid, p = arrivals.pop(0)
            eng.add_request(p, params, request_id=rid)
            arrived_at[rid] = at
        while conn and admitted < load["arrivals"] and conn.poll():
            rid, at, p, data = conn.recv()
            admit_with_remote_kv(eng, rid, p, params, torch.from_numpy(data))
            arrived_at[rid] = at
            admitted += 1
        if not eng.has_unfinished():
            time.sleep(0.0005)
            continue
        deltas = eng.step()
        t = time.perf_counter()
        for d in deltas:
            if d.request_id in residents and d.new_token_ids:
                if d.request_id in last:
                    itl.append((t - last[d.request_id]) * 1e3)
                last[d.request_id] = t
            elif d.request_id in arrived_at and d.new_token_ids:
                ttft.append((t - t0 - arrived_at.pop(d.request_id)) * 1e3)
    return {"itl_ms": itl, "ttft_ms": ttft}


def prefill_round(eng: LLMEngine, load: dict, rnd: int, conn) -> dict:
    """The prefill instance's round: prefill each prompt when it arrives, send its blocks, free them."""
    t0 = time.perf_counter()
    for i in range(load["arrivals"]):
        at, rid, p = i * load["period_s"], f"p{rnd}-{i}", long_prompt(rnd, i, load["prompt"])
        while time.perf_counter() - t0 < at:
            time.sleep(0.0005)
        req = prefill_only(eng, rid, p)
        # by value, as bytes on a socket (a numpy array pickles its data; a tensor would go through shared memory)
        conn.send((rid, at, p, pack(eng.runner.kv_cache, req.block_table).numpy()))
        eng.abort(rid)
    return {}


def child() -> None:
    """A timed process. "decode" holds two engines: the colocated one, run on both cores, and the decode instance,
    run on the second core only (one process, so one start-up; its affinity and threads change per round). "prefill"
    holds the prefill instance on the first core. Each stdin line starts one round; the result is one JSON line."""
    from multiprocessing.connection import Client, Listener

    load, cores = json.loads(args.load), [int(c) for c in args.cores.split(",")]
    cfg = dict(model=args.model, kv_cache_tokens=load["kv_tokens"])
    if args.role == "decode":
        pin(set(cores))
        engines = {"colocated": LLMEngine(EngineConfig(**cfg)), "decode": LLMEngine(EngineConfig(**cfg))}
        socket.setdefaulttimeout(120)  # a peer that never connects ends this process instead of leaving it waiting
        listener = Listener(args.sock, "AF_UNIX")
        say({"ready": True})
        conn = listener.accept()
        socket.setdefaulttimeout(None)
    else:
        pin({cores[0]})
        engine = LLMEngine(EngineConfig(**cfg))
        for _ in range(600):  # the decode side may still be starting: its socket appears when it listens
            try:
                conn = Client(args.sock, "AF_UNIX")
                break
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.1)
        say({"ready": True})
    for rnd, line in enumerate(iter(sys.stdin.readline, "")):  # until the parent closes stdin
        which = line.strip()
        if args.role == "prefill":
            say(prefill_round(engine, load, rnd, conn))
        elif which == "colocated":
            pin(set(cores))
            say(serve_round(engines["colocated"], load, rnd))
        else:
            pin({cores[1]})
            say(serve_round(engines["decode"], load, rnd, conn))


# ---- the verdict, from the repeats' numbers --------------------------------------------------------------------------
def verdict(coloc: list[dict], disagg: list[dict]) -> str:
    """coloc / disagg: one dict per repeat with the running decodes' ITL in ms: "mean" (their TPOT: every prefill
    step they wait through adds to it) and "max" (the longest stall). A side is better only where every repeat of it
    beats every repeat of the other (the ranges do not overlap); otherwise the noise between repeats is larger than
    the effect."""
    said = []
    for key, name in (("mean", "mean ITL"), ("max", "longest ITL")):
        c, d = [r[key] for r in coloc], [r[key] for r in disagg]
        rng = f"colocated {min(c):.2f}-{max(c):.2f} ms, disaggregated {min(d):.2f}-{max(d):.2f} ms"
        if max(d) < min(c):
            said.append(f"{name}: disaggregated lower ({min(c) / max(d):.1f}x at least; {rng})")
        elif max(c) < min(d):
            said.append(f"{name}: colocated lower ({min(d) / max(c):.1f}x at least; {rng})")
        else:
            said.append(f"{name}: inconclusive on this machine (the repeats overlap: {rng})")
    return "; ".join(said)


def summary(runs: list[dict]) -> list[dict]:
    return [{"p50": statistics.median(r["itl_ms"]), "mean": statistics.fmean(r["itl_ms"]), "max": max(r["itl_ms"]),
             "ttft": statistics.median(r["ttft_ms"]) if r["ttft_ms"] else float("nan")} for r in runs]


# OpenMP threads that spin at a barrier wait for the other core even when a neighbour holds it; on a shared machine
# a 2-thread engine then takes tens of ms per step. PASSIVE makes them sleep instead, in all three processes alike.
ENV = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def start(model: str, load: dict) -> dict[str, subprocess.Popen] | None:
    """Spawn the two timed processes (they build their engines while the lab's first part runs)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        print("timing skipped: this process may run on 1 core; the split needs 2")
        return None
    sock = os.path.join(tempfile.mkdtemp(prefix="inferlab-disagg-"), "kv.sock")
    return {role: subprocess.Popen([sys.executable, __file__, "--role", role, "--model", model,
                                    "--cores", f"{cores[0]},{cores[1]}", "--sock", sock, "--load", json.dumps(load)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, **ENV})
            for role in ("decode", "prefill")}


def timed(procs: dict[str, subprocess.Popen], repeats: int) -> tuple[list[dict], list[dict]]:
    """A warm-up round of each arrangement (first prefills of a shape pay for its kernels' setup), then the repeats,
    colocated and the pair alternating, never both at once; then the processes end."""
    def read(p: subprocess.Popen) -> dict:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"a timed process exited with {p.wait()}")
        return json.loads(line)

    def send(p: subprocess.Popen, line: str) -> None:
        p.stdin.write(line + "\n")
        p.stdin.flush()

    results: dict[str, list[dict]] = {"colocated": [], "decode": []}
    try:
        for p in procs.values():
            read(p)  # ready
        for _ in range(repeats + 1):
            send(procs["decode"], "colocated")
            results["colocated"].append(read(procs["decode"]))
            send(procs["decode"], "decode")
            send(procs["prefill"], "go")
            results["decode"].append(read(procs["decode"]))
            read(procs["prefill"])
    finally:
        end(procs)
    return summary(results["colocated"][1:]), summary(results["decode"][1:])


def end(procs: dict[str, subprocess.Popen]) -> None:
    """Close their stdin (each returns at EOF); one still stuck after 10 s (e.g. waiting for its peer) is killed."""
    for p in procs.values():
        if not p.stdin.closed:
            p.stdin.close()
    for p in procs.values():
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def worked() -> None:
    """The worked number: Llama-3.1-8B, one 8,192-token prompt, on H100 SXM GPUs (spec: 989 dense bf16 TFLOPS,
    3.35 TB/s HBM3, NVLink 900 GB/s in all = 450 each way, PCIe Gen5 x16 128 GB/s = 64 each way) and a 400 Gb/s
    ConnectX-7 NIC between nodes (DGX H100)."""
    tokens, kv_tok, weights = 8192, 131072, 8.03e9 - 128256 * 4096  # matmul weights: the embedding is a lookup
    kv, prefill = tokens * kv_tok, 2 * weights * tokens / 989e12
    step = weights * 2 / 3.35e12  # a decode step at small batch reads every bf16 weight once
    print(f"Llama-3.1-8B, an {tokens:,}-token prompt, H100: its KV is {tokens:,} x {kv_tok:,} B = {kv / 1e9:.2f} GB; "
          f"its prefill is 2 x {weights / 1e9:.2f} B x {tokens:,} = {2 * weights * tokens / 1e12:.0f} TFLOP, "
          f"{prefill * 1e3:.0f} ms at 989 TFLOPS; moving the KV takes {kv / 450e9 * 1e3:.1f} ms over NVLink "
          f"(450 GB/s), {kv / 64e9 * 1e3:.1f} ms over PCIe Gen5 (64 GB/s), {kv / 50e9 * 1e3:.1f} ms over one 400 Gb/s "
          f"NIC (50 GB/s); a decode step reads the {weights * 2 / 1e9:.1f} GB of weights in {step * 1e3:.2f} ms, so "
          f"the prefill, run in the decodes' steps, stalls them for {prefill / step:.0f} steps' worth")


# ---- the lab ----------------------------------------------------------------------------------------------------------
def main() -> None:
    model = os.path.abspath(resolve_model(args.model))
    load = dict(residents=4, tokens=48, arrivals=8, prompt=256, period_s=0.01, repeats=3, kv_tokens=4096)
    if args.full:
        load = dict(residents=4, tokens=256, arrivals=24, prompt=512, period_s=0.05, repeats=5, kv_tokens=16384)
    procs = start(model, load)  # they load while the first part runs
    try:
        first_part(model)
    except BaseException:
        if procs:
            end(procs)
        raise
    if procs:
        second_part(procs, load)
    worked()


def first_part(model: str) -> None:
    cfg = dict(model=model, kv_cache_tokens=2048)
    prompts = {"a": [5 + 3 * t for t in range(37)], "b": [900 + 7 * t for t in range(21)],
               "c": [2000 + t for t in range(50)]}
    params = SamplingParams(max_tokens=8, **GREEDY)

    coloc = LLMEngine(EngineConfig(**cfg, record_steps=True))
    for rid, p in prompts.items():
        coloc.add_request(p, params, request_id=rid)
    want = run_all(coloc)

    prefill, decode = LLMEngine(EngineConfig(**cfg)), LLMEngine(EngineConfig(**cfg, record_steps=True))
    bpt = prefill.runner.kv_bytes_per_token
    got: dict[str, list[int]] = {}
    for rid, p in prompts.items():  # one at a time: the decode instance is already decoding the earlier ones
        req = prefill_only(prefill, rid, p)
        src, first = list(req.block_table), req.output_token_ids[0]
        data = pack(prefill.runner.kv_cache, src)
        prefill.abort(rid)  # sent: the prefill instance frees its blocks
        dst = admit_with_remote_kv(decode, rid, p, params, data)
        for d in decode.step():
            got.setdefault(d.request_id, []).extend(d.new_token_ids)
        print(f"request {rid}: {len(p)} prompt tokens prefilled on instance P (block table {src}, first token "
              f"{first}); {len(src)} blocks x {decode.cfg.block_size} slots x {bpt:,} B = {data.numel() * 4:,} B "
              f"copied into instance D's blocks {dst}; D recomputes token {len(p) - 1} and samples {got[rid][0]}")
        assert got[rid][0] == first, "the decode instance's first token differs from the prefill instance's"
    for rid, toks in run_all(decode).items():
        got[rid].extend(toks)
    for rid in prompts:
        print(f"request {rid}: colocated {want[rid]}; disaggregated {got[rid]}")
    assert got == want, "the disaggregated pair's greedy tokens differ from the colocated engine's"
    computed = {name: sum(r.num_prefill_tokens for r in e.step_records) for name, e in (("D", decode), ("C", coloc))}
    print(f"greedy tokens identical for all {len(prompts)} requests; prompt tokens computed: the colocated engine "
          f"{computed['C']}, instance D {computed['D']} (the last of each prompt): D read P's KV, it did not "
          f"recompute it")
    assert computed["D"] == len(prompts) and computed["C"] == sum(map(len, prompts.values()))


def second_part(procs, load: dict) -> None:
    print(f"load: {load['residents']} requests decoding {load['tokens']} tokens each while {load['arrivals']} prompts "
          f"of {load['prompt']} tokens arrive, one every {load['period_s'] * 1e3:.0f} ms; {load['repeats']} repeats of "
          f"each arrangement, alternating")
    res = timed(procs, load["repeats"])
    for name, rows in zip(("colocated (both cores, 2 threads)", "disaggregated (prefill on core 0, decode on core 1)"),
                          res):
        print(f"{name}: decodes' ITL median " + ", ".join(f"{r['p50']:.2f}" for r in rows) + " ms; mean "
              + ", ".join(f"{r['mean']:.2f}" for r in rows) + " ms; max "
              + ", ".join(f"{r['max']:.1f}" for r in rows) + " ms; arriving prompts' TTFT p50 "
              + ", ".join(f"{r['ttft']:.1f}" for r in rows) + " ms")
    print("verdict: " + verdict(*res))


if __name__ == "__main__":
    child() if args.role else main()
