"""What chapters 18-20 (disaggregation, mixture of experts, KV tiers) quote from their labs, checked against the
labs' own output; the conventions are lab_quotes.py's, which collects these checks into `CHECKS`."""
from __future__ import annotations

import re

from tests.docs.handbook import num, quoted


def ch18(run, text):
    out = run("python docs/handbook/labs/18_disaggregate.py")
    moves = re.findall(r"request (\w): (\d+) prompt tokens prefilled on instance P \(block table (\[[\d, ]+\]), first token "
                       r"(\d+)\); \d+ blocks x \d+ slots x ([\d,]+) B = ([\d,]+) B copied into instance D's blocks "
                       r"(\[[\d, ]+\]); D recomputes token (\d+) and samples (\d+)", out)
    assert [m[0] for m in moves] == ["a", "b", "c"] and all(m[3] == m[8] for m in moves)  # D's first token is P's
    _, n, src, _, per_tok, nbytes, dst, last, _ = moves[1]
    assert src != dst, "the lab should show the blocks landing under other ids"
    quoted(text, f"request b's {n} prompt tokens are prefilled on P in its block table {src} and copied into D's "
                 f"blocks {dst}, {nbytes} B; D recomputes token {last}", f"{per_tok} B of KV per token",
           f"request b's blocks {src} on P land in blocks {dst} on D")
    colo, d = re.search(r"prompt tokens computed: the colocated engine (\d+), instance D (\d+)", out).groups()
    assert "greedy tokens identical for all 3 requests" in out
    quoted(text, f"the colocated engine computed {colo} prompt tokens, instance D {d}")
    users, res, arr, tok, every, reps = re.search(r"load: (\d+) requests decoding (\d+) tokens each while (\d+) prompts of "
                                                  r"(\d+) tokens arrive, one every (\d+) ms; (\d+) repeats", out).groups()
    assert users == "4"
    quoted(text, f"Four requests decode {res} tokens each while {arr} prompts of {tok} tokens arrive, one every {every} ms",
           f"then {reps} repeats alternate")
    # the timing verdict is computed from the repeats (test_lab_conclusions flips it); here only its form
    assert re.search(r"^verdict: mean ITL: (disaggregated lower|colocated lower|inconclusive on this machine).*; longest ITL: "
                     r"(disaggregated lower|colocated lower|inconclusive on this machine)", out, re.M)
    kv, tflop, ms, nv, pcie, nic, wgb, step, stall = re.search(
        r"its KV is [\d,]+ x [\d,]+ B = ([\d.]+) GB; its prefill is 2 x [\d.]+ B x [\d,]+ = (\d+) TFLOP, (\d+) ms at 989 "
        r"TFLOPS; moving the KV takes ([\d.]+) ms over NVLink \(450 GB/s\), ([\d.]+) ms over PCIe Gen5 \(64 GB/s\), ([\d.]+) "
        r"ms over one 400 Gb/s NIC \(50 GB/s\); a decode step reads the ([\d.]+) GB of weights in ([\d.]+) ms, so the "
        r"prefill, run in the decodes' steps, stalls them for (\d+) steps", out).groups()
    quoted(text, f"**{kv} GB**", f"= {tflop} TFLOP, {ms} ms at 989 TFLOPS", f"Moving the KV takes {nv} ms over NVLink",
           f"{pcie} ms over PCIe Gen5 (64 GB/s), {nic} ms over one 400 Gb/s NIC", f"the {wgb} GB of weights in **{step} ms**",
           f"stalls them for {stall} steps' worth: one stall of {ms} ms")


def ch19(run, text):
    out = run("python docs/handbook/labs/19_moe.py")
    assert re.search(r"max \|difference\| from HF's forward: .*\(all equal to fp32 rounding", out)
    quoted(text, "all equal to fp32 rounding")
    b16 = re.search(r"batch   16: tokens per expert \[[\d, ]+\], (\d+) of (\d+) experts read; intensity ([\d.]+) against "
                    r"dense ([\d.]+) \(([\d.]+)x lower\)", out).groups()
    quoted(text, f"at batch 16, {b16[0]} of {b16[1]} experts read and intensity {b16[2]} against a dense layer's {b16[3]} "
                 f"({b16[4]}x lower)")
    ratio = num(r"batch  256: tokens per expert \d+-\d+, 60 of 60 experts read; intensity [\d.]+ against dense [\d.]+ "
                r"\(([\d.]+)x lower\)", out, float)
    assert ratio == 60 / 4
    quoted(text, f"the ratio is E / k = {ratio}")
    busy, x = re.search(r"the busiest expert has (\d+) tokens, ([\d.]+)x the mean", out).groups()
    quoted(text, f"has {busy} tokens, {x}x the mean")
    per_exp, per_dev, fewer, remote = re.search(r"([\d,]+) copies counted once per expert, ([\d,]+) once per device \(([\d.]+)x "
                                                r"fewer\), of which ([\d,]+) leave", out).groups()
    quoted(text, f"the {per_exp} copies the routing would send counted once per expert are {per_dev} once per device "
                 f"({fewer}x fewer), of which {remote} leave their own device")
    have, most, pad = re.search(r"batch 16: (\d+) of 60 experts have tokens, at most (\d+); the padded bmm computes 60 x \d+ "
                                r"rows, (\d+) of them padding", out).groups()
    quoted(text, f"at batch 16, {pad} of its {60 * int(most)} rows are padding and only {have} of the 60")
    verdicts = re.findall(r"^  (batch \d+[:,] (?:the padded bmm|grouped_mm).*)$", out, re.M)
    assert len(verdicts) >= 2, "no timing verdicts"  # computed from the passes, never quoted as numbers
    for line in verdicts:
        assert re.search(r"(faster than|slower than|as fast as) the loop|inconclusive on this machine", line), line
    mb, us, ms, mb_e, ms_e = re.search(r"dispatch \+ combine ([\d.]+) MB per GPU per MoE layer, (\d+) us at 450 GB/s, ([\d.]+) "
                                       r"ms per step \(counted once per expert: ([\d.]+) MB, ([\d.]+) ms\)", out).groups()
    remote_dev = num(r"at most 4 devices, ([\d.]+) of them remote", out, float)
    quoted(text, f"{remote_dev} of them remote on average", f"**{mb} MB per GPU per MoE layer**, {us} us at NVLink's 450 GB/s",
           f"**{ms} ms per step**", f"{mb_e} MB per layer and take {ms_e} ms")
    mx, qw, ds = re.search(r"a batch of ([\d,]+) for Mixtral-8x7B \(8 experts, top-2\), ([\d,]+) for Qwen1.5-MoE-A2.7B "
                           r"\(60, top-4\) and ([\d,]+) for DeepSeek-V3", out).groups()
    quoted(text, f"{mx} tokens for Mixtral-8x7B, {qw} for Qwen1.5-MoE-A2.7B, {ds} for DeepSeek-V3")


def ch20(run, text):
    out = run("python docs/handbook/labs/20_kv_tiers.py")
    users, turns, first, later, answer, pool = re.search(
        r"workload: (\d+) users x (\d+) turns, taken in turn; each user's first message a (\d+)-token document and question, "
        r"each later one (\d+) tokens, answers (\d+) tokens; .*Pool: (\d+) tokens", out).groups()
    quoted(text, f"{users} users × {turns} turns, taken in turn; each user's first message a {first}-token document and "
                 f"question, each later one {later} tokens, answers {answer} tokens", f"The pool holds {pool} tokens")
    assert "outputs identical with and without the tier" in out
    h0, q, p0, h1, p1, t1 = re.search(r"without the tier: ([\d,]+) of ([\d,]+) prompt tokens found cached \((\d+)%\); with it: "
                                      r"([\d,]+) \((\d+)%\), of which ([\d,]+) read back", out).groups()
    written, read = re.search(r"tier counters: (\d+) blocks written .*?, (\d+) read back", out).groups()
    quoted(text, f"without the tier, {h0} of {q} prompt tokens found cached ({p0}%); with it, {h1} ({p1}%)",
           f"{written} blocks written, {read} read back")
    assert t1 == h1 and "all of them read back from the file" in text  # the pool is too small to keep any of it
    assert re.search(r"^verdict: (the file tier cut|reading the file was slower|inconclusive on this machine)", out, re.M)
    per_tok, per_gpu, gb = re.search(r"= ([\d,]+) B per token \(([\d,]+) B on each GPU at TP=8\); an 8,192-token prefix is "
                                     r"([\d.]+) GB", out).groups()
    pf, ms, node, load, thresh = re.search(r"= ([\d.]+) PFLOP, (\d+) ms at the node's ([\d.]+) PFLOP/s.*?: ([\d.]+) ms; any "
                                           r"tier delivering more than ([\d.]+) GB/s", out).groups()
    quoted(text, f"**{per_tok} B per token**, {per_gpu} B on each GPU", f"holds {gb} GB", f"= {pf} PFLOP, **{ms} ms**",
           f"the node's {node} PFLOP/s", f"takes **{load} ms**", f"more than {thresh} GB/s to the node")
    w, hbm, host, nvme = re.search(r"after the (\d+) GB of weights ([\d.]+) M tokens \(before activations\); 2 TB of host memory "
                                   r"([\d.]+) M; 8 x 3.84 TB of NVMe (\d+) M", out).groups()
    quoted(text, f"after the {w} GB of weights, the node's HBM holds {hbm} M tokens", f"2 TB of host memory {host} M",
           f"3.84 TB NVMe drives {nvme} M")
