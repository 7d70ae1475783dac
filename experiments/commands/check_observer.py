"""`inferlab check-observer CONFIG`: is the harness disturbing what it measures?

Runs one load level of one engine twice on the same started engine: once with the harness
as configured (memory sampler, optional timeline, records written as they finish), once
with a bare client that does nothing but send and timestamp (for OpenAI-compatible
servers it speaks raw HTTP and bypasses the adapter too). Each run is bracketed by a
scrape of the engine's own histograms. Prints the three views side by side and a verdict;
exit code 0 when the harness agrees with the bare client and with the server, 1 when not,
2 for a usage or config problem.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from adapters.base import Engine, EngineInfo, GenerationRequest, SamplingConfig
from adapters.transport import sse
from experiments.measuring import metrics, observer
from experiments.measuring.memory import MemorySampler
from experiments.running.load import LoadGenerator, Outcome, chains
from experiments.running.results import EngineDir, record
from experiments.workload.workloads import WorkItem

KEYS = (("ttft_ms", "ttft", "TTFT mean (ms)"), ("itl_ms", "itl", "ITL mean (ms)"), ("e2el_ms", "e2e", "E2EL mean (ms)"))


async def _bare_openai(impl: Any, items: list[WorkItem], sampling: dict[str, Any], conc: int) -> list[dict]:
    """Raw streaming HTTP: send, stamp every token-bearing line, nothing else."""
    headers = {"Authorization": f"Bearer {impl.options['api_key']}"} if impl.options.get("api_key") else {}
    out: list[dict] = []
    queue = list(reversed(items))
    streamer = await sse.Streamer(impl.base_url, headers).open()  # the adapters' own stream client
    try:
        async def one(it: WorkItem) -> None:
            body = impl._completion_body(GenerationRequest(it.request_id, it.prompt_token_ids,
                                                           SamplingConfig(**sampling, max_tokens=it.output_len)))
            events, ids, send = [], [], time.perf_counter_ns()
            async with streamer.post("/v1/completions", body) as resp:
                async for t, line in resp.lines():
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        c = (json.loads(line[5:]).get("choices") or [{}])[0]
                        got = c.get("token_ids") or ([-1] if c.get("text") else [])
                        if got:
                            events.append([t, len(got)])
                            ids += got
            out.append({"request_id": it.request_id, "send_ns": send, "events": events, "output_token_ids": ids,
                        "prompt_token_ids": it.prompt_token_ids, "done_ns": events[-1][0] if events else send,
                        "output_len": it.output_len})

        async def worker() -> None:
            while queue:
                await one(queue.pop())

        await asyncio.gather(*(worker() for _ in range(min(conc, len(items)))))
    finally:
        await streamer.aclose()
    return out


async def _bare_adapter(engine: Engine, items: list[WorkItem], sampling: dict[str, Any], conc: int) -> list[dict]:
    recs: list[dict] = []
    gen = LoadGenerator(engine, sampling, lambda o: recs.append(record(o, "bare", 0)) if o.ok else None)
    await gen.closed([[it] for it in items], conc)
    return recs


async def _run_once(engine: Engine, info: EngineInfo, cfg: Any, items: list[WorkItem], conc: int,
                    out: EngineDir | None) -> tuple[list[dict], dict[str, Any]]:
    """One measured pass: with `out`, as the harness runs it (sampler, timeline if configured,
    each record written as it finishes); without, the bare client."""
    sampling = cfg.sampling.model_dump()
    await engine.reset_prefix_cache()
    warm = LoadGenerator(engine, sampling, lambda o: None)
    await warm.closed([[w] for w in items[:2]], conc)
    bracket = observer.Bracket(engine, info)
    await bracket.open()
    if out is None:
        recs = await (_bare_openai(engine, items, sampling, conc) if hasattr(engine, "_completion_body")
                      else _bare_adapter(engine, items, sampling, conc))
    else:
        sampler = MemorySampler(info.pid).start()
        if cfg.observer.timeline_s:
            sampler.timeline = observer.Timeline(engine, info, asyncio.get_running_loop(), cfg.observer.timeline_s)
        recs = []

        def done(o: Outcome) -> None:
            if o.ok:
                recs.append(record(o, "harness", 0))
                out.append(recs[-1])

        try:
            await LoadGenerator(engine, sampling, done).closed([[it] for it in items], conc)
        finally:
            await asyncio.to_thread(sampler.stop)
            out.close()
    view = (await bracket.close(len(items))).get("server_view")
    return recs, view


def _views(recs: list[dict], view: dict[str, Any] | None) -> tuple[dict, dict | None]:
    s = metrics.summarize(recs)
    return s, observer.compare(s, view)


async def check(engine: Engine, cfg: Any, items: list[WorkItem], conc: int, work: Path) -> dict[str, Any]:
    info = await engine.start()
    try:
        h, hv = await _run_once(engine, info, cfg, items, conc, EngineDir(work, "harness"))
        b, bv = await _run_once(engine, info, cfg, items, conc, None)
    finally:
        await engine.stop()
    (hs, hc), (bs, bc) = _views(h, hv), _views(b, bv)
    return {"engine": info.engine, "harness": hs, "bare": bs, "harness_vs_server": hc, "bare_vs_server": bc}


# The harness's ITL / E2EL may exceed the bare client's by this much before the verdict says it
# disturbs the engine: two runs back to back on a 2-core machine differ by up to ~15 % by themselves.
DISTURB_REL = 0.25


def verdict(r: dict[str, Any]) -> tuple[bool, list[str]]:
    """(agree, reasons). The harness agrees when its TTFT is within the flag limit of the bare
    client's, its ITL and E2EL means are within DISTURB_REL of the bare client's, and, where the
    engine has its own view, each client agrees with the server's.

    The ITL/E2EL comparison with the bare run is what catches an observer that slows the engine
    itself (a timeline scraping a /metrics route that blocks the server's loop): then the harness
    and the server agree with each other, both slowed, and only the bare run shows the difference."""
    why = []
    h, b = r["harness"]["ttft_ms"]["mean"], r["bare"]["ttft_ms"]["mean"]
    if h is not None and b is not None and h - b > observer.TTFT_ABS_MS + observer.TTFT_REL * b:
        why.append(f"the harness's TTFT mean ({h:.1f} ms) exceeds the bare client's ({b:.1f} ms): the harness "
                   "itself disturbs the engine or reads the streams late")
    for key, what in (("itl_ms", "ITL"), ("e2el_ms", "E2EL")):
        h, b = r["harness"][key]["mean"], r["bare"][key]["mean"]
        if h is not None and b and h > b * (1 + DISTURB_REL):
            why.append(f"the harness's {what} mean ({h:.2f} ms) is {h / b - 1:.0%} above the bare client's "
                       f"({b:.2f} ms): the harness slows the engine while it measures it")
    for who in ("harness", "bare"):
        c = r[f"{who}_vs_server"]
        if c and c["flags"]:
            why.append(f"{who} client vs the server's own view: " + "; ".join(c["flags"]))
    return not why, why


def render(r: dict[str, Any]) -> str:
    rows = []
    for key, hkey, label in KEYS:
        cells = [label, r["harness"][key]["mean"], r["bare"][key]["mean"]]
        for who in ("harness", "bare"):
            c = r[f"{who}_vs_server"]
            cells.append((c or {}).get("rows", {}).get(hkey, {}).get("server_ms"))
        rows.append(cells)
    head = ["metric", "harness", "bare client", "server (harness run)", "server (bare run)"]
    fmt = lambda v: "–" if v is None else (f"{v:,.2f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = [" | ".join(f"{h:>20}" for h in head)]
    lines += [" | ".join(f"{fmt(c):>20}" for c in row) for row in rows]
    ok, why = verdict(r)
    lines.append("")
    lines.append("verdict: OK — the harness agrees with the bare client" + (" and with the engine's own view"
                 if r["harness_vs_server"] else " (this engine exports no latency histograms)") if ok
                 else "verdict: DISAGREE — " + " | ".join(why))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    import argparse

    from experiments.commands.run import ensure_model, fail
    from experiments.running.runner import build_engine
    from experiments.workload.config import ConfigError, load
    from experiments.workload.workloads import build

    p = argparse.ArgumentParser(prog="inferlab check-observer", description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("--engine", help="the engine to check (default: the config's first)")
    p.add_argument("--concurrency", type=int, help="closed-loop concurrency (default: the config's first level)")
    p.add_argument("--json", action="store_true", help="print the raw result as JSON")
    a = p.parse_args(argv)
    try:
        cfg = load(a.config, engine=a.engine)
        ensure_model(cfg)
        items, _ = build(cfg.model, cfg.workload, 0)
    except (ConfigError, ValueError, OSError) as e:
        return fail(str(e))
    kind, value = cfg.load.levels()[0]
    conc = a.concurrency or (int(value) if kind == "concurrency" else 4)
    name = cfg.all_engines()[0]
    work = Path(tempfile.mkdtemp(prefix="inferlab-check-"))
    try:
        engine, _, _ = build_engine(cfg, name, work)
    except (ValueError, TypeError) as e:
        return fail(f"{a.config}: engine_options.{name}: {e}")
    items = [ch[0] for ch in chains(items)]  # single-turn: the bare client sends no chains
    try:
        r = asyncio.run(check(engine, cfg, items, conc, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(r, default=str, indent=1) if a.json else f"{name}, concurrency {conc}, {len(items)} requests\n"
          + render(r))
    return 0 if verdict(r)[0] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
