"""What each chapter quotes from its lab, checked against the lab's own output.

`CHECKS[chapter]` is a function `(run, text)`: `run("python docs/handbook/labs/NN.py")` is that command's
stdout (run once per session), `text` the chapter with its whitespace collapsed. Each check reads the
numbers from the output and asserts the chapter states exactly those; prose and labs cannot drift.
Numbers quoted from the tiny model are deterministic; machine-dependent timings are checked only for
their form (a computed verdict, or "inconclusive on this machine"), never for their value.
"""
from __future__ import annotations

import re

from tests.docs.handbook import num, quoted


def ch01(run, text):
    out = run("python docs/handbook/labs/01_tokenize.py")
    chars, toks = num(r"\((\d+) chars", out), num(r"\((\d+) tokens; vocabulary", out) - 1  # minus BOS
    quoted(text, f"is {chars} characters and {toks} text tokens ({chars / toks:.1f} characters per token)")
    real, vocab = num(r"SmolLM2.*?\): (\d+) text tokens", out), num(r"vocabulary of ([\d,]+)", out)
    quoted(text, f"the real model's {vocab:,}-token BPE splits it into {real} "
                 f"({chars / real:.1f} characters per token)")
    total, added = re.search(r"(\d+) tokens for a \d+-token message: (\d+) added by the template", out).groups()
    quoted(text, f"wraps the same message in {total} tokens: {added} added by the template")


def ch02(run, text):
    out = run("python docs/handbook/labs/02_prefill.py")
    flops = num(r"params x tokens = ([\d,]+)", out)
    quoted(text, f"is {round(flops / 1e6)} MFLOPs of layer matmuls")
    diff = num(r"max \|logit diff\| ([\d.e+-]+);", out, float)
    assert diff < 1e-4 and "same next token: True" in out, diff  # what the chapter says to expect
    quoted(text, "should be float32 rounding (the tests allow 1e-4)")


def ch04(run, text):
    out = run("python docs/handbook/labs/04_decode.py --steps 4")
    intensity = num(r"= ([\d.]+) FLOP/byte", out, float)
    quoted(text, f"({intensity:.1f} in float32)")
    assert re.search(r"was faster at every step: recompute / decode = [\d.]+x median|inconclusive on this machine", out)


def ch06(run, text):
    out = run("python docs/handbook/labs/06_kv_cache.py")
    table = re.search(r"block table (\[[\d, ]+\])", out).group(1)
    big, tiny = num(r"= ([\d,]+) B/token", out), num(r"x 4 B = ([\d,]+) B", out)
    quoted(text, f"the block table `{table}`", f"{big:,} bytes = 128 KiB per token", f"= {tiny:,} bytes per token")
    assert set(re.findall(r"block table (\[[\d, ]+\])", text)) == {table}, "the diagram's block table is not the lab's"


def ch07(run, text):
    out = run("python docs/handbook/labs/07_sample.py")
    p = re.search(r"softmax\(logits\)\s+the:([\d.]+) a:([\d.]+)", out).groups()
    t = re.search(r"temperature 0.5 \(sharper\)\s+the:([\d.]+) a:([\d.]+)", out).groups()
    top_p = re.search(r"top-p 0.8\s+(.*)", out).group(1)
    order = re.search(r"min-p 0.4 then top-p 0.75\s+(.*)", out).group(1).split()
    quoted(text, f"({p[0]} vs {p[1]})", f"({t[0]} vs {t[1]})",
           "renormalised to " + ", ".join(x.split(":")[1] for x in top_p.split()),
           "[" + ", ".join(v if float(v) else "0" for v in order) + "]")
    # only T = 0 is greedy: a positive temperature below 0.01 is stored as 0.01 and samples
    greedy = re.findall(r"temperature (\S+) -> stored as \S+: greedy", out)
    raised = num(r"temperature 1e-06 -> stored as ([\d.]+): sampled", out, float)
    assert greedy == ["0"], greedy
    quoted(text, "Only temperature 0 is greedy", f"so T = 1e-6 samples at {raised:g}", 'argmax (T = 0)')


def ch08(run, text):
    out = run("python docs/handbook/labs/08_request_state.py")
    r1 = re.search(r"r1: preempted with (\d+) tokens, re-admitted at step (\d+) with (\d+) of them .* it recomputes (\d+)", out)
    r2 = re.search(r"r2: preempted with (\d+) tokens, re-admitted at step \d+ with (\d+) of them", out)
    held, step, hit, redo = r1.groups()
    quoted(text, f"`r1` is preempted with {held} tokens", f"re-admitted at step {step}, {hit} of its {held}",
           f"it recomputes {redo}", f"finds {r2.group(2)} of its {r2.group(1)}")


def ch09(run, text):
    out = run("python docs/handbook/labs/09_schedule.py")
    chunks = [m for m in re.findall(r"long prefill (\d+)", out)]
    first_all_decode = next(int(m.group(1)) for m in re.finditer(r"step (\d+): .*", out)
                            if "prefill" not in m.group(0) and m.group(0).count("decode") == 3)
    quoted(text, "takes " + " + ".join(chunks), f"from step {first_all_decode} everyone decodes")


def ch10(run, text):
    out = run("python docs/handbook/labs/10_continuous_batching.py")
    c = re.search(r"continuous: (\d+) steps, seats busy (\d+)/(\d+) \((\d+)%\)", out).groups()
    s = re.search(r"static:\s+(\d+) steps, seats busy (\d+)/(\d+) \((\d+)%\)", out).groups()
    quoted(text, f"**{s[0]} steps** with {s[1]} of {s[2]} seat-steps busy ({s[3]}%)",
           f"**{c[0]} steps** at {c[1]} of {c[2]} ({c[3]}%)")
    fewer = num(r"continuous batching finished in (\d+) fewer steps than static batching", out)
    assert fewer == int(s[0]) - int(c[0]) and "(the run agrees)" in out
    quoted(text, f"continuous batching finished in {fewer} fewer steps")


def ch11(run, text):
    out = run("python docs/handbook/labs/11_paged_memory.py")
    m = re.search(r"tokens stored (\d+), slots held (\d+) \((\d+)%.*would hold (\d+) slots for them \((\d+)%\)", out)
    stored, held, pct, reserved, rpct = m.groups()
    quoted(text, f"{stored} tokens of five requests occupy {held} slots ({pct}% used)",
           f"would hold {int(reserved):,} slots ({rpct}% used)", f"only {num(r'only (.) fit', out)} such")


def ch12(run, text):
    out = run("python docs/handbook/labs/12_prefix_cache.py")
    q, h, pct = re.search(r"total: (\d+) tokens looked up, (\d+) found cached \((\d+)%\)", out).groups()
    hit1 = num(r"admitted: \{.1.: (\d+)", out)
    quoted(text, f"**{q} tokens queried, {h} hit ({pct}%)**", f"`hit {hit1} tokens`")
    ab = re.search(r"^a and b (share their first \d+ blocks? \(\d+ tokens\)|share no block)", out, re.M).group(1)
    ac = re.search(r"^a and c (share no block, though c contains a's first \d+ tokens)", out, re.M).group(1)
    quoted(text, f"a and b {ab}", f"a and c {ac}")
    p1, a1, t2, same, hits = re.search(r"turn 1 = (\d+) prompt \+ (\d+) answer tokens; turn 2 = (\d+) tokens, of which "
                                       r"the first (\d+) repeat .*; (\d+) found cached", out).groups()
    quoted(text, f"turn 1 is {p1} prompt + {a1} answer tokens", f"is {t2} tokens, of which the first {same} repeat "
                 f"turn 1's tokens exactly, and {hits} are found cached", f"the {int(same) - int(hits)} tokens of turn 1's")


def ch13(run, text):
    out = run("python docs/handbook/labs/13_speculative.py")
    target, emitted, acc, toks = re.search(r"target argmax at the 1 \+ 3 rows (\[[\d, ]+\]) -> emit (\[[\d, ]+\]) \((\d+) "
                                           r"drafts? accepted, then the target's own token: (\d+) tokens? from one pass",
                                           out).groups()
    assert int(toks) == len(emitted.split(",")) and int(acc) == int(toks) - 1
    quoted(text, f"against the target's argmax {target}", f"{acc} drafts accepted, then the target's own token: "
                 f"{toks} tokens from one pass")
    steps, n, drafts, acc = re.search(r"(\d+) steps for (\d+) tokens; drafts verified (\d+), accepted (\d+)", out).groups()
    quoted(text, f"{n} tokens take {steps} steps instead of {n}: {drafts} drafts verified, {acc} accepted")
    (q_steps, q_d, q_a, q_rate), (f_steps, f_d, f_a, _) = re.findall(
        r"real text, .*?: 24 tokens in (\d+) steps; drafts verified (\d+), accepted (\d+) \((\d+)%\)", out)
    quoted(text, f"24 tokens in {q_steps} steps with {q_a} of {q_d} drafts accepted ({q_rate}%)",
           f"24 tokens in {f_steps} steps with {f_a} of {f_d} drafts accepted")


def ch14(run, text):
    out = run("python docs/handbook/labs/14_serving.py")
    assert re.search(r"refused with HTTP 503: .*'Retry-After': '1'", out)
    quoted(text, "refuses the third with HTTP 503 and `Retry-After: 1`")


def ch15(run, text):
    # the worked number, computed by the harness's own functions
    from experiments.measuring.metrics import meets_slo, per_request

    ms = 1_000_000
    row = per_request({"request_id": "w", "send_ns": 0, "events": [[100 * ms, 1], [130 * ms, 1], [190 * ms, 2]],
                       "output_token_ids": [1, 2, 3, 4], "prompt_token_ids": [0]})
    quoted(text, f"**TTFT = {row['ttft_ms']:.0f} ms**", "the ITL values are " + ", ".join(f"{v:.0f}" for v in row["itl_ms"][:-1])
           + f" and {row['itl_ms'][-1]:.0f} ms", f"**E2EL = {row['e2el_ms']:.0f} ms**", f"= {row['tpot_ms']:.0f} ms**")
    assert meets_slo(row, {"ttft_ms": 500, "tpot_ms": 200}) and not meets_slo(row, {"ttft_ms": 80})
    mem = run("python docs/handbook/labs/15_memory.py")
    w, kv, used = re.search(r"are (\d+)% and the KV pool (\d+)%; this workload used at most (\d+)% of the pool", mem).groups()
    quoted(text, f"the weights take {w} % of what is allocated, the pool {kv} %, and the workload uses at most "
                 f"{used} % of the pool")
    assert "every block is free again" in mem
    out = run("python docs/handbook/labs/15_measure.py")
    for var in ("prompt tokens", "output tokens", "concurrency"):  # one computed verdict per sweep
        assert re.search(rf"^{var} \d+ -> \d+: (moved \(intervals apart\)|nothing moved)", out, re.M), var
    assert re.search(r"^prompt tokens \d+ -> \d+: TTFT x[\d.]+ measured .*?: (the FLOPs explain the growth|the FLOPs do "
                     r"not, the prefill times do|unexplained on this machine)", out, re.M)
    # the full run is recorded by the lab itself (--out), its table pulled into the chapter by build_tables.py;
    # the reading must quote the record's own verdict lines, and the record must be in the lab's current format
    from tests.docs.handbook import REPO
    rec_path = re.search(r"\(\.\./perf/(\d{4}-\d\d-\d\d-handbook-measure-sweep\.md)\)", text).group(1)
    rec = (REPO / "docs" / "perf" / rec_path).read_text()
    assert f"--full --out docs/perf/{rec_path}`" in rec
    header = re.search(r"^\| sweep \|.*$", out, re.M).group(0)
    assert header in rec, "the record's table is not in the lab's current format: rerun --full --out"
    ttft, tpot = (num(rf"prompt tokens 16 -> 1024: moved \(intervals apart\):.*?{k} ([\d.]+)x", rec, float)
                  for k in ("TTFT", "TPOT"))
    quoted(text, f"TTFT, {ttft}× for 64× the tokens, while TPOT moves {tpot}×")
    mm = num(r"1024 tokens: matmuls [\d.]+ GFLOP, causal attention [\d.]+ GFLOP \(\+([\d.]+)% over", rec, float)
    att = re.search(r"1024 tokens: matmuls ([\d.]+) GFLOP, causal attention ([\d.]+) GFLOP", rec).groups()
    why = re.search(r"prompt tokens 16 -> 1024: TTFT x([\d.]+) measured \(the ratio's range inside the intervals "
                    r"x([\d.]+)-x([\d.]+)\); FLOPs predict x([\d.]+), this process's prefill times x([\d.]+)-x([\d.]+): (.*)",
                    rec).groups()
    assert float(why[0]) == ttft
    quoted(text, f"*less* than the {why[3]}× the FLOPs predict", f"causal attention adds {mm}% to the matmuls",
           f"grew x{why[4]}–x{why[5]}")
    assert why[6].startswith("the FLOPs do not, the prefill times do")  # what the reading says
    rates = re.search(r"attention ran at (\d+) GFLOP/s and everything else at (\d+) \(at 16 tokens: (\d+)\)", why[6]).groups()
    t16, t1k, a1k = re.search(r"16 tokens ([\d.]+) ms at fastest.*?1024 tokens ([\d.]+) ms at fastest \(of which the "
                              r"attention backend ([\d.]+) ms\)", rec).groups()
    quoted(text, f"({rates[2]} GFLOP/s outside attention", f"much of its {t16} ms", f"at {rates[1]} GFLOP/s outside attention",
           f"attention itself at {rates[0]} GFLOP/s", f"takes {float(a1k) / float(t1k):.0%} of that prefill's time "
           f"({a1k} of {t1k} ms) for {float(att[1]) / (float(att[0]) + float(att[1])):.0%} of its FLOPs")
    out_sweep = re.search(r"^output tokens 4 -> 128: (.*)$", rec, re.M).group(1)
    e2el_o = num(r"moved \(intervals apart\): E2EL ([\d.]+)x;", out_sweep, float)  # E2EL alone moved
    assert "inconclusive on this machine (intervals overlap): TTFT, TPOT" in out_sweep
    quoted(text, f"E2EL alone, {e2el_o}× for 32× the tokens (TTFT and TPOT do not move beyond their intervals")
    c = re.search(r"concurrency 1 -> 8: moved \(intervals apart\): TTFT ([\d.]+)x, TPOT ([\d.]+)x.*"
                  r"output tok/s ([\d.]+) -> ([\d.]+)", rec).groups()
    quoted(text, f"Concurrency 8 serves {c[3]} output tokens/s against {c[2]} for one user and pays in TTFT ({c[0]}×) "
                 f"and TPOT ({c[1]}×)")
    # the first run of the day, kept for what it shows: a disturbance the intervals of one run cannot see
    first = (REPO / "docs" / "perf" / "2026-12-04-handbook-13-sweep.md").read_text()
    tpot_first = num(r"output tokens 4 -> 128: moved \(intervals apart\): TPOT ([\d.]+)x", first, float)
    c4, c8 = (float(re.search(rf"^\| concurrency \| {n} \|.* \| ([\d.]+) \|$", first, re.M).group(1)) for n in (4, 8))
    assert c8 < c4
    quoted(text, f"read TPOT {tpot_first}× along the output sweep, and fewer tokens/s at concurrency 8 than at 4")


def ch03(run, text):
    out = run("python docs/handbook/labs/03_roofline.py")
    w_mib = num(r"float32 = (\d+) MiB", out)
    llc = re.search(r"last-level cache (\d+) MiB", out)
    assert not llc or w_mib >= 2 * int(llc.group(1))  # W is at least twice the detected last-level cache
    assert re.search(r"^(inconclusive on this machine|time per doubling of the batch)", out, re.M)
    best, rate = num(r"TB/s = ([\d.]+) ms", out, float), num(r"at most (\d+) tokens/s", out)
    decodes, step = num(r"one prefill step \+ (\d+) decode steps", out), num(r"at most ~([\d.]+) ms per decode", out, float)
    floor, share = num(r"floor ([\d.]+) ms", out, float), num(r"floor is at least ~([\d.]+)%", out, float)
    rest = num(r"up to ~(\d+)% of it is not bandwidth", out)
    quoted(text, f"= **{best:.2f} ms per token at best, ~{rate} tokens/s**", f"one prefill step and {decodes} decode",
           f"~{step} ms is an upper bound on one decode step", f"**{floor} ms**", f"at least ~{share}%",
           f"up to ~{rest}% of it is something else", "it was never profiled")
    prof = run("python docs/handbook/labs/03_profile.py")
    calls = num(r"(\d+) operator calls", prof)
    assert 100 <= calls < 1000, calls
    quoted(text, "a few hundred operator calls")
    assert "inferlab::decode_layer" in prof  # the fast path shows in the profile (the kernels are profiler regions)
    assert re.search(r"inside the operators [\d.]+ ms = \d+%, outside them [\d.]+ ms", prof) and "Chrome trace written to" in prof
    assert re.search(r"outside the operators, by phase \(from the profile's ranges\): .*runner [\d.]+ ms", prof)
    assert re.search(r"^  (overhead-bound|operators-bound|inconclusive on this machine)", prof, re.M)


def ch21(run, text):
    out = run("python docs/handbook/labs/21_engines.py")
    assert re.search(r"TPOT \(E2E - TTFT\) / \(tokens - 1\) = \([\d.]+ - [\d.]+\) / \d+ = [\d.]+ ms", out)
    quoted(text, "computes TTFT and TPOT from them exactly as the report does")
    # the prose that chooses engines quotes the measured tables above it: every decimal it cites is in them
    prose = re.search(r"## When to choose which (.*?) ## Lab", text).group(1)
    tables = " ".join(re.findall(r"<!-- table: .*? -->(.*?)<!-- /table", text))
    cited = re.findall(r"\d+\.\d+(?:–\d+\.\d+)?", prose)
    assert cited and all(c in tables for c in cited), [c for c in cited if c not in tables]


def ch05(run, text):
    out = run("python docs/handbook/labs/05_attention.py")
    verdicts = re.findall(r"^(.*?): (agree to rounding|DISAGREE) \(max \|difference\|", out, re.M)
    assert [v for _, v in verdicts] == ["agree to rounding"] * 4, verdicts  # softmax, tiles, by hand, C++ kernel
    held, keys = re.search(r"scores held at once: (\d+) of (\d+)", out).groups()
    quoted(text, f"one query over {keys} keys in tiles of {held} holds {held} scores at a time and matches the "
                 "untiled formula to rounding")
    table = re.search(r"block table (\[[\d, ]+\]), block size", out).group(1)
    walk = re.findall(r"tokens (\d+)-(\d+) in block (\d+)", out)
    slot = num(r"slot mapping \[(\d+)\]", out)
    h, hkv = re.search(r"model: (\d+) query heads, (\d+) KV heads", out).groups()
    quoted(text, f"the block table `{table}` (tokens {walk[0][0]}–{walk[0][1]} in block {walk[0][2]}, "
                 + ", ".join(f"{a}–{b} in block {blk}" for a, b, blk in walk[1:]) + f", the decoding token at slot {slot})",
           f"{h} query heads over {hkv} KV heads", f"block table {table}")
    gqa = num(r"it would be [\d,]+ \((\d+)x\)", out)
    mla, mha, x = re.search(r"([\d,]+) B/token; the same heads as MHA would cache ([\d,]+) \((\d+)x\)", out).groups()
    full, win = re.search(r"holds ([\d.]+) GiB with full attention, ([\d.]+) GiB within the window", out).groups()
    need, total = re.search(r"= (\d+) blocks of 16 before it, not all (\d+)", out).groups()
    quoted(text, f"multi-head attention ({gqa}×)", f"MLA ({mla} B per token against {mha}, {x}×)",
           f"at {win} GiB instead of {full} GiB", f"needs {need} cached blocks of 16 for a prefix hit instead of {total}",
           f"shrinks ~{x}×")


def ch17(run, text):
    out = run("python docs/handbook/labs/17_quantize.py")
    kinds = dict(re.findall(r"(Q4_1|Q8_0) [\d.]+ M weights in [\d.]+ MB \(([\d.]+) bits per weight\)", out))
    q4 = num(r"Q4_1 ([\d.]+) M weights", out, float)
    quoted(text, f"{q4} M weights in Q4_1 at {kinds['Q4_1']} bits per weight, the embedding in Q8_0 at {kinds['Q8_0']}",
           f"**{kinds['Q4_1'][:1]} bits per weight**")
    name = re.search(r"^(\S+) \(\d+, \d+\) Q4_1, first block", out, re.M).group(1)
    assert "gguf.quants.dequantize of the same 20 bytes: bit-identical over 32 weights" in out
    quoted(text, f"first block of `{name}` by hand", "bit-identical to `gguf.quants.dequantize` of the same 20 bytes")
    # the timing verdicts: computed, or inconclusive; never quoted as numbers
    assert re.search(r"^(fp32 \(the baseline\): [\d.]+ GB/s = \d+% of the copy bandwidth|inconclusive on this machine)",
                     out, re.M)
    errs = dict(part.rsplit(" ", 1) for part in
                re.search(r"error in y \(relative, against fp64\): (.*)", out).group(1).split("; "))
    kv_err = num(r"fp8 e4m3 KV cache \(one scale per tensor\): relative error ([\d.]+%)", out, str)
    quoted(text, f"bf16 {errs['bf16 weights and activations']}, int8 with a scale per row "
                 f"{errs['int8 weights, a scale per row']}, fp8 e4m3 with a scale per row "
                 f"{errs['fp8 e4m3 weights, a scale per row']}, int4 with a scale and minimum per 32 (Q4_1-style) "
                 f"{errs['int4 weights, scale and min per 32 (Q4_1-style)']}", f"over an fp8 KV cache, {kv_err}")
    for fmt, gb, ms, tps in re.findall(r"H200, (bf16|fp8|int4)[^:]*: ([\d.]+) GB per step -> ([\d.]+) ms, at most (\d+)",
                                       out):
        quoted(text, f"{gb} GB, **{ms} ms**", f"{tps} tokens/s")
    kv16, kv8, g16, g8 = re.search(r"bf16 ([\d,]+) B, fp8 ([\d,]+) B.*?need (\d+) GiB in bf16, (\d+) GiB in fp8", out).groups()
    quoted(text, f"{kv16} B per token in bf16, {kv8} B in fp8", f"need {g16} GiB of KV in bf16, {g8} GiB in fp8")


def ch16(run, text):
    out = run("python docs/handbook/labs/16_parallel.py")
    ranks = re.findall(r"rank (\d): query heads (\d+)-(\d+) \(\d+\), KV heads (\d+)-(\d+) \(\d+\), MLP columns (\d+)-(\d+)", out)
    (_, q0, q1, k0, k1, i0, i1), (_, q2, q3, k2, k3, i2, i3) = ranks
    quoted(text, f"rank 0 query heads {q0}-{q1} with KV heads {k0}-{k1}, rank 1 query heads {q2}-{q3} with KV head {k2}",
           f"MLP columns {i0}-{i1} and {i2}-{i3}", f"heads {q0}-{q1}<br/>(KV heads {k0}-{k1})",
           f"gate/up rows {i0}-{i1}", f"{int(q1) - int(q0) + 1} + {int(q3) - int(q2) + 1}",
           f"{int(q1) - int(q0) + 1} heads against {int(q3) - int(q2) + 1}")
    assert "(the same to fp32 rounding)" in out
    calls, size = re.search(r"per step (\d+) all-reduces \(\d+ = 2 per layer\) of ([\d,]+) B", out).groups()
    quoted(text, f"{calls} all-reduces of {size} B per step", "layer 0's MLP equals the sum of the two ranks' partial outputs")
    # the verdict is computed from the measured numbers; its wording depends on them, never quoted as a number
    assert re.search(r"^(the bytes explain the all-reduce time|measured \d+% against [\d.]+% estimated)", out, re.M)
    for batch, nbytes, us, ms, read in re.findall(r"TP=8 over NVLink, batch (\d+): \d+ all-reduces of ([\d,]+) B per step, "
                                                  r"bytes alone ([\d.]+) us each, ([\d.]+) ms per step, against ([\d.]+) ms", out):
        quoted(text, f"{nbytes} B", f"{us} us", f"**{read} ms**" if batch == "1" else f"**{ms} ms**")
    pp = num(r"PP=2: one send of ([\d,]+) B per token", out)
    e, k, g, layers, per_layer, mb, per_exp, mb_exp = re.search(
        r"EP=8: (\d+) routed experts in \d+ groups, top-(\d+) within at most (\d+) groups, (\d+) MoE layers.*?at most "
        r"([\d,]+) B per MoE layer, at most ([\d.]+) MB per token \(counted once per expert it would be ([\d,]+) B, "
        r"([\d.]+) MB\)", out).groups()
    quoted(text, f"sends {pp:,} B per token once per step", f"({e} routed experts, top-{k} within at most {g} groups, "
           f"{layers} MoE layers", f"sends each token to at most {g} devices: at most {per_layer} B per token per MoE "
           f"layer, **at most {mb} MB per token**", f"would say {per_exp} B and {mb_exp} MB")
    # KV bytes per token per rank: replicated KV heads past TP = KV heads, the whole MLA latent on every rank
    rank16, even16 = re.search(r"KV at TP=16: 1 KV head per rank, ([\d,]+) B per token on each rank \(8 KV heads split "
                               r"evenly would be ([\d,]+) B", out).groups()
    mla = num(r"\(MLA\) KV at TP=8: 1 latent per rank, ([\d,]+) B per token on every rank", out)
    quoted(text, f"at TP=16 still cost each rank {rank16} B per token, where an even split would be {even16} B",
           f"at TP=8 stores all {mla:,} B per token on every rank")


from tests.docs.lab_quotes_scale import ch18, ch19, ch20  # noqa: E402,F401  (chapters 18-20: serving at scale)

CHECKS = {f"{int(name[2:]):02d}": fn for name, fn in dict(globals()).items() if re.fullmatch(r"ch\d\d", name)}
