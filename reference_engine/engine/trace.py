"""`inferlab trace`: run the reference engine one step at a time and show what each step did.

Per step: the scheduled requests (prefill / decode tokens, drafts), the model's input shapes,
each running request's block table (blocks reused through a prefix-cache hit marked `*`,
blocks held by several requests marked `xN`), KV blocks used / free / cached and their bytes,
prefix-cache lookups and hits, speculative tokens proposed and accepted, each emitted token
with its top-k probabilities, every request's state (and computed / total tokens) with the
running and waiting counts, the block-table width the step used (the buffer is wider), a memory
line (weights, KV allocated / used) and state transitions. After the steps, a note when step
times vary more than `NOISY`x around their median (a shared machine: read them as indicative).
A first run that has to compile the C++ CPU kernels says so on stderr before it goes quiet for
a minute. `--json` prints one document (`{"config", "steps", "summary"}`) for tools.

With `--requests K` the K prompts are the given prompt plus a different suffix each, so they
share the prompt's full blocks. A block is cached only once its KV is computed (vLLM's rule),
so request 0 is admitted alone and the others join after its prefill: they then hit.

Everything comes from `EngineConfig(record_steps=True)` (`StepRecord`, step_record.py), the
token deltas (`SamplingParams(logprobs=k)` gives the top-k), and the engine's own objects.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
from pathlib import Path

from reference_engine.config import EngineConfig
from reference_engine.distributed.sharding import rank_shapes
from reference_engine.engine.llm_engine import LLMEngine
from reference_engine.sampling_params import SamplingParams

DEFAULT_MODEL = Path("models/tiny-llama")  # relative to the working directory, as the quickstart's
DEFAULT_PROMPT = "The quick brown fox jumps over the lazy dog, and the lazy dog sleeps."
NOISY = 2.0  # step times more than this factor from the median of their kind get a noise note
SUFFIXES = [" Then the cat", " Later a bird", " Soon the rain", " After that the sun", " Next the wind"]


def suffix(i: int) -> str:
    return SUFFIXES[i % len(SUFFIXES)] + ("" if i < len(SUFFIXES) else f" {i}")


def resolve_model(model: str | None, note=print) -> str:
    """The model directory: as given, or `models/tiny-llama` under the working directory, made if absent."""
    if model:
        return model
    if not (DEFAULT_MODEL / "config.json").is_file():
        from reference_engine.model.make import make_model

        note(f"no --model given: making a tiny random-weight Llama in {DEFAULT_MODEL} (once; a few seconds)")
        make_model(DEFAULT_MODEL, preset="tiny", family="llama", seed=0, force=True)
    else:
        note(f"no --model given: using {DEFAULT_MODEL}")
    return str(DEFAULT_MODEL)


@contextlib.contextmanager
def announce_kernel_builds(note):
    """Say so when the C++ CPU kernels are compiled (a kernel-cache miss: about a minute of silence
    otherwise). The build goes through torch's `load_inline`; a cached kernel never calls it."""
    from torch.utils import cpp_extension

    real, said = cpp_extension.load_inline, []

    def load_inline(*a, **kw):
        if not said:
            note("building the CPU kernels (once; cached afterwards, about a minute on 2 cores) ...")
            said.append(True)
        return real(*a, **kw)

    cpp_extension.load_inline = load_inline
    try:
        yield
    finally:
        cpp_extension.load_inline = real


REAL_MODEL = Path("models/smollm2-135m-instruct")


def resolve_real_model(model: str | None, note=print) -> str:
    """The real model's directory for the labs that teach better on real text: as given, or
    `models/smollm2-135m-instruct` under the working directory, made if absent (the download and
    the conversion are cached under ~/.cache/inferlab, as `inferlab make-model --preset` does)."""
    if model:
        return model
    if not (REAL_MODEL / "config.json").is_file():
        from reference_engine.model.gguf import make_real_model

        note(f"no --model given: making SmolLM2-135M-Instruct in {REAL_MODEL} (once; cached conversion)")
        make_real_model(REAL_MODEL, "smollm2-135m-instruct")
    else:
        note(f"no --model given: using {REAL_MODEL}")
    return str(REAL_MODEL)


def build_engine(args) -> LLMEngine:
    spec = None
    if args.speculative == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens,
                "prompt_lookup_min": args.lookup_min, "prompt_lookup_max": args.lookup_max}
    return LLMEngine(EngineConfig(
        model=args.model, block_size=args.block_size, kv_cache_tokens=args.kv_tokens,
        max_num_batched_tokens=args.max_num_batched_tokens, enable_prefix_caching=args.prefix_cache,
        speculative_config=spec, record_steps=True, seed=args.seed, device=args.device,
        tensor_parallel_size=args.tensor_parallel_size))


def run_trace(args, note=print) -> dict:
    """Run the trace; return {"config", "steps", "summary"} (plain JSON types)."""
    with announce_kernel_builds(note):  # the kernels build at the engine's start or its first step
        eng = build_engine(args)
        return _run(eng, args)


def _run(eng: LLMEngine, args) -> dict:
    tok, mc, kv = eng.tokenizer, eng.model_config, eng.scheduler.stats()
    mem = eng.memory_report()
    per_tok = mc.kv_bytes_per_token(eng.runner.dtype)
    block_bytes = per_tok * kv.block_size
    texts = [args.prompt] if args.requests == 1 else [args.prompt + suffix(i) for i in range(args.requests)]
    prompts = [tok.encode(t) for t in texts]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                            ignore_eos=True, logprobs=args.top)
    config = {
        "model": args.model, "family": mc.family, "layers": mc.num_layers, "kv_heads": mc.num_kv_heads,
        "head_dim": mc.head_dim, "dtype": str(eng.runner.dtype).replace("torch.", ""), "vocab": mc.vocab_size,
        "kv_bytes_per_token": per_tok, "block_size": kv.block_size, "block_bytes": block_bytes,
        "num_blocks": kv.kv_total_blocks, "max_num_batched_tokens": args.max_num_batched_tokens,
        "prefix_caching": args.prefix_cache, "speculative": args.speculative, "max_tokens": args.max_tokens,
        "temperature": args.temperature, "top_logprobs": args.top,
        # each weight layout by name; the activation peak only where a profile forward measured it at start (CUDA)
        "memory": {k: v for k, v in mem.items() if k in ("weights", "kv_allocated", "graph_pool") or k.startswith("layout_")
                   or (k == "activation_peak" and "device_total" in mem)},
        "requests": [{"id": str(i), "text": t, "num_tokens": len(p)} for i, (t, p) in enumerate(zip(texts, prompts))],
        "tensor_parallel": rank_shapes(mc, args.tensor_parallel_size),
    }
    reqs, status = {}, {}

    def add(i: int) -> None:
        rid = eng.add_request(prompts[i], params, request_id=str(i))
        reqs[rid] = eng.requests[rid]

    add(0)
    pending = list(range(1, args.requests))
    steps, outputs = [], {str(i): [] for i in range(args.requests)}
    while eng.has_unfinished() or pending:
        first = reqs["0"]
        if pending and (first.is_finished or first.num_computed_tokens >= first.num_prompt_tokens):
            for i in pending:  # request 0's prompt blocks are computed and cached now: the others can hit
                add(i)
            pending = []
        before = {rid: status.get(rid, "new") for rid in reqs}
        deltas = eng.step()
        rec = eng.step_records[-1]
        now = {rid: r.status.value for rid, r in reqs.items()}
        scheduled = {rid for rid, _, _ in rec.scheduled}
        tokens = {}
        for d in deltas:
            outputs[d.request_id] += d.new_token_ids
            if d.new_token_ids:
                tokens[d.request_id] = [_token(tok, t, lp) for t, lp in
                                        zip(d.new_token_ids, d.logprobs or [None] * len(d.new_token_ids))]
        steps.append({
            "step": rec.step, "duration_ms": round(rec.duration_s * 1e3, 3),
            "scheduled": [{"request": rid, "kind": kind, "tokens": n, "drafts": len(rec.spec_tokens.get(rid, ()))}
                          for rid, n, kind in rec.scheduled],
            "num_prefill_tokens": rec.num_prefill_tokens, "num_decode_tokens": rec.num_decode_tokens,
            "num_verify_tokens": rec.num_verify_tokens,
            "input_shapes": {k: list(v) for k, v in rec.input_shapes.items()},
            # the widest block table among this step's sequences: the columns the kernels read
            "block_table_width_used": max((len(rec.block_tables[r]) if r in rec.block_tables else  # finished: freed
                                           -(-reqs[r].num_computed_tokens // kv.block_size) for r in scheduled), default=0),
            "requests": {str(i): ({"state": now[str(i)], "computed": reqs[str(i)].num_computed_tokens,
                                   "tokens": reqs[str(i)].num_tokens} if str(i) in reqs else
                                  {"state": "not added yet", "computed": 0, "tokens": len(prompts[i])})
                         for i in range(args.requests)},
            "memory": {"weights": mem["weights"], "kv_allocated": mem["kv_allocated"],
                       "kv_used": rec.kv_blocks_used * block_bytes},
            "cuda_graph_bucket": rec.cuda_graph_bucket,
            "kv": {"blocks_used": rec.kv_blocks_used, "blocks_free": rec.kv_blocks_free,
                   "blocks_cached": rec.kv_blocks_cached, "bytes_used": rec.kv_blocks_used * block_bytes,
                   "bytes_free": rec.kv_blocks_free * block_bytes, "bytes_cached": rec.kv_blocks_cached * block_bytes},
            "prefix_cache": {"queries": rec.prefix_cache_queries, "hits": rec.prefix_cache_hits,
                             "queries_total": None, "hits_total": None, "hit_tokens": dict(rec.prefix_hits)},
            "block_tables": {rid: {"blocks": t, "hit_blocks": rec.prefix_hit_blocks.get(rid, 0),
                                   "refs": eng.scheduler.ref_counts(t)} for rid, t in rec.block_tables.items()},
            "speculative": {rid: {"proposed": d, "accepted": d[:rec.spec_accepted.get(rid, 0)]}
                            for rid, d in rec.spec_tokens.items()},
            "tokens": tokens,
            "transitions": [{"request": rid, "from": before[rid], "to": now[rid]} for rid in reqs
                            if before[rid] != now[rid]],
            "preempted": rec.preempted, "finished": rec.finished,
            "num_running": rec.num_running, "num_waiting": rec.num_waiting, "allreduces": rec.allreduces,
        })
        status.update(now)
    # running totals of the prefix-cache counters (vLLM's prefix_cache_queries / _hits)
    q = h = 0
    for s in steps:
        q += s["prefix_cache"]["queries"]
        h += s["prefix_cache"]["hits"]
        s["prefix_cache"]["queries_total"], s["prefix_cache"]["hits_total"] = q, h
    st = eng.stats()
    summary = {
        "noise": noise(steps),
        "steps": len(steps), "prefix_cache_queries": st.prefix_cache_queries,
        "prefix_cache_hits": st.prefix_cache_hits, "preemptions": st.num_preemptions_total,
        "spec_draft_tokens": st.spec_decode_num_draft_tokens,
        "spec_accepted_tokens": st.spec_decode_num_accepted_tokens,
        "outputs": {rid: {"token_ids": ids, "text": tok.decode(ids)} for rid, ids in outputs.items()},
    }
    eng.close()  # tensor-parallel workers, if any
    return {"config": config, "steps": steps, "summary": summary}


def noise(steps: list[dict]) -> dict | None:
    """Steps of the same shape (prefill or decode only, same token count) should take about the same
    time; if any is more than NOISY x from its group's median, return the spread, else None."""
    groups: dict[tuple, list[float]] = {}
    for s in steps:
        groups.setdefault((s["num_prefill_tokens"] > 0,
                           s["num_prefill_tokens"] + s["num_decode_tokens"] + s["num_verify_tokens"]),
                          []).append(s["duration_ms"])
    ratios = [max(d / statistics.median(g), statistics.median(g) / max(d, 1e-9))
              for g in groups.values() if len(g) >= 3 for d in g]
    if not ratios or max(ratios) <= NOISY:
        return None
    times = [s["duration_ms"] for s in steps]
    return {"min_ms": min(times), "max_ms": max(times), "worst_ratio": round(max(ratios), 2), "threshold": NOISY}


def _token(tok, token_id: int, lp) -> dict:
    top = sorted((lp.top if lp else {}).items(), key=lambda kv: -kv[1])
    return {"id": token_id, "text": tok.decode([token_id], skip_special_tokens=False),
            "prob": round(math.exp(lp.logprob), 4) if lp else None,
            "top": [{"id": i, "text": tok.decode([i], skip_special_tokens=False), "prob": round(math.exp(v), 4)}
                    for i, v in top]}


# ---- terminal rendering ---------------------------------------------------------------------
def _kib(n: int) -> str:
    return f"{n / 1024:,.1f} KiB"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def render(doc: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    con = console or Console(highlight=False)
    c = doc["config"]
    con.rule("inferlab trace")
    con.print(Text(
        f"model {c['model']} ({c['family']}, {c['layers']} layers, {c['kv_heads']} KV heads x {c['head_dim']}, "
        f"{c['dtype']})\nKV bytes/token = 2 (K and V) x {c['layers']} layers x {c['kv_heads']} heads x "
        f"{c['head_dim']} x {c['kv_bytes_per_token'] // (2 * c['layers'] * c['kv_heads'] * c['head_dim'])} B = "
        f"{c['kv_bytes_per_token']:,} B; block = {c['block_size']} tokens = {_kib(c['block_bytes'])}; "
        f"pool = {c['num_blocks']} blocks\nprefix caching {'on' if c['prefix_caching'] else 'off'}, "
        f"speculation {c['speculative'] or 'off'}, token budget {c['max_num_batched_tokens']}/step\n"
        f"memory: weights {_mib(c['memory']['weights'])}, KV allocated {_mib(c['memory']['kv_allocated'])}"
        + "".join(f", {k} {_mib(v)}" for k, v in c["memory"].items() if k not in ("weights", "kv_allocated"))
        + " (activations: measured at start on CUDA only)\n"
        "block tables: * = block reused through a prefix-cache hit, xN = held by N requests"))
    for r, shapes in enumerate(c["tensor_parallel"] or []):  # each decoder layer's weights on each rank
        con.print(Text(f"rank {r}: " + ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())))
    for r in c["requests"]:
        con.print(Text(f"request {r['id']}: {r['num_tokens']} prompt tokens  {r['text']!r}"))
    for s in doc["steps"]:
        con.rule(f"step {s['step']}  ({s['duration_ms']:.1f} ms)", align="left")
        g = Table.grid(padding=(0, 2))
        g.add_column(style="bold", no_wrap=True)
        g.add_column()
        g.add_row("scheduled", ", ".join(
            f"req {x['request']} {x['kind']} {x['tokens']}" + (f" (1 + {x['drafts']} drafts)" if x["drafts"] else "")
            for x in s["scheduled"]) + f"   [prefill {s['num_prefill_tokens']}, decode {s['num_decode_tokens']}"
            + (f", verify {s['num_verify_tokens']}]" if s["num_verify_tokens"] else "]"))
        graph = f"  (CUDA graph: replayed at batch {s['cuda_graph_bucket']})" if s["cuda_graph_bucket"] else ""
        g.add_row("inputs", "  ".join(f"{k} {tuple(v)}" for k, v in s["input_shapes"].items()) + graph
                  + f"  (block tables: {s['block_table_width_used']} columns used)")
        g.add_row("requests", f"running {s['num_running']}, waiting {s['num_waiting']}: " + ", ".join(
            f"req {r} {x['state']} {x['computed']}/{x['tokens']}" for r, x in s["requests"].items()))
        k = s["kv"]
        g.add_row("KV blocks", f"used {k['blocks_used']} ({_kib(k['bytes_used'])})  free {k['blocks_free']} "
                               f"({_kib(k['bytes_free'])})  cached {k['blocks_cached']} ({_kib(k['bytes_cached'])})")
        m = s["memory"]
        g.add_row("memory", f"weights {_mib(m['weights'])}, KV allocated {_mib(m['kv_allocated'])}, "
                            f"KV used {_mib(m['kv_used'])} ({m['kv_used'] / max(m['kv_allocated'], 1):.0%})")
        p = s["prefix_cache"]
        hits = "".join(f"; req {r} hit {n} tokens" for r, n in p["hit_tokens"].items())
        g.add_row("prefix cache", f"queries {p['queries']} hits {p['hits']} (total {p['queries_total']} / "
                                  f"{p['hits_total']}){hits}")
        for rid, t in s["block_tables"].items():
            cells = [f"{b}{'*' if i < t['hit_blocks'] else ''}{f'x{n}' if n > 1 else ''}"
                     for i, (b, n) in enumerate(zip(t["blocks"], t["refs"]))]
            g.add_row(f"table {rid}", Text("[" + " ".join(cells) + "]"))
        for rid, sp in s["speculative"].items():
            g.add_row(f"spec {rid}", f"proposed {sp['proposed']} accepted {len(sp['accepted'])} {sp['accepted']}")
        for rid, toks in s["tokens"].items():
            for t in toks:
                top = "  ".join(f"{x['text']!r} {x['prob']:.3f}" for x in t["top"])
                g.add_row(f"token {rid}", Text(f"{t['text']!r} (id {t['id']}, p {t['prob']})  top: {top}"))
        if s["allreduces"]:
            a = s["allreduces"]
            g.add_row("all-reduce", f"{len(a)} x {tuple(a[0]['shape'])} ({_kib(sum(x['bytes'] for x in a))}, "
                                    f"{sum(x['ms'] for x in a):.2f} ms): " + ", ".join(x["layer"] for x in a[:4])
                      + (", ..." if len(a) > 4 else ""))
        for tr in s["transitions"]:
            g.add_row("state", f"req {tr['request']}: {tr['from']} -> {tr['to']}")
        con.print(g)
    sm = doc["summary"]
    con.rule("summary")
    rate = f" ({sm['prefix_cache_hits'] / sm['prefix_cache_queries']:.0%})" if sm["prefix_cache_queries"] else ""
    con.print(Text(f"{sm['steps']} steps; prefix cache: {sm['prefix_cache_queries']} tokens looked up, "
                   f"{sm['prefix_cache_hits']} hit{rate}; preemptions {sm['preemptions']}; speculative: "
                   f"{sm['spec_draft_tokens']} drafts verified, {sm['spec_accepted_tokens']} accepted"))
    for rid, o in sm["outputs"].items():
        con.print(Text(f"request {rid} output: {o['text']!r}"))
    if sm["noise"]:
        n = sm["noise"]
        con.print(Text(f"note: step times ranged {n['min_ms']:.1f}-{n['max_ms']:.1f} ms, and a step took up to "
                       f"{n['worst_ratio']}x the median of steps of its shape (threshold {n['threshold']}x): "
                       "the machine is busy or noisy; read the durations as indicative only"))


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="inferlab trace", description=__doc__.splitlines()[0])
    ap.add_argument("prompt", nargs="?", default=DEFAULT_PROMPT, help="the prompt (default: a short sentence)")
    ap.add_argument("--model", help=f"model directory (default: {DEFAULT_MODEL}, made if absent)")
    ap.add_argument("--max-tokens", type=int, default=6, help="tokens to generate per request (default 6)")
    ap.add_argument("--requests", type=int, default=1,
                    help="K requests: the prompt + a different suffix each, sharing its blocks (default 1)")
    ap.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=True,
                    help="prefix caching (default on)")
    ap.add_argument("--speculative", choices=["ngram"], help="speculative decoding method")
    ap.add_argument("--num-speculative-tokens", type=int, default=3, help="drafts per step (default 3)")
    ap.add_argument("--lookup-min", type=int, default=1, help="n-gram: shortest suffix to look up (default 1)")
    ap.add_argument("--lookup-max", type=int, default=3, help="n-gram: longest suffix to look up (default 3)")
    ap.add_argument("--top", type=int, default=3, help="top-k probabilities shown per token (default 3)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=4, help="tokens per KV block (default 4: small, to see blocks)")
    ap.add_argument("--kv-tokens", type=int, default=256, help="KV pool size in tokens (default 256)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget per step")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="ranks (processes): shows each rank's weight shards and the all-reduces of each step")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the terminal view")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.max_tokens < 1:
        ap.error("--requests and --max-tokens must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.model = resolve_model(args.model, note=lambda m: print(m, file=sys.stderr))
    try:
        doc = run_trace(args, note=lambda m: print(m, file=sys.stderr, flush=True))
    except ValueError as e:
        print(f"inferlab trace: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(doc))
    else:
        render(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
