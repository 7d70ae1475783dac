"""Each lab's printed conclusion follows from its own numbers.

A lab words its conclusion in a function of the numbers it measured. Here that function is taken out of
the lab file (the file's imports, its literal constants and the named functions; nothing of the run) and
fed numbers of the lab's kind, then a planted contrary number: the conclusion must change, or turn
"inconclusive". A lab that printed a fixed sentence whatever it measured would fail here.
"""
from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest

from tests.docs import handbook as hb


def lab_functions(lab: str, *names: str) -> SimpleNamespace:
    """The named top-level functions of docs/handbook/labs/<lab>, defined without running the lab."""
    path = hb.LABS / lab
    tree = ast.parse(path.read_text())

    def literal(node) -> bool:
        try:
            ast.literal_eval(node.value)
            return True
        except ValueError:
            return False

    keep = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
            or (isinstance(n, ast.FunctionDef) and n.name in names)
            or (isinstance(n, ast.Assign) and literal(n))]
    found = {n.name for n in keep if isinstance(n, ast.FunctionDef)}
    assert found == set(names), f"{lab} defines no {sorted(set(names) - found)}"
    ns: dict = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), ns)
    return SimpleNamespace(**{n: ns[n] for n in names})


def test_lab_10_compares_the_two_runs_step_counts():
    f = lab_functions("10_continuous_batching.py", "compare")
    assert f.compare(12, 21) == "continuous batching finished in 9 fewer steps than static batching"
    assert "the same number of steps" in f.compare(21, 21)  # planted: static no worse
    assert "took 2 more steps" in f.compare(23, 21)


def test_lab_12_shares_only_what_the_hashes_share():
    f = lab_functions("12_prefix_cache.py", "shared_blocks", "sharing", "contains")
    a, b = ["2a55", "c585"], ["2a55", "c585", "2d43"]
    assert f.sharing("a", a, "b", b, 4) == "a and b share their first 2 blocks (8 tokens)"
    assert f.sharing("a", a, "b", ["2a55", "ffff", "2d43"], 4) == "a and b share their first 1 block (4 tokens)"
    assert f.sharing("a", a, "b", ["ffff", "c585"], 4) == "a and b share no block"  # equal 2nd hash, different parent
    assert f.contains([0, 5, 6, 7], [5, 6]) and not f.contains([0, 5, 6, 7], [6, 5])


def rows_of(times: list[float], spread: float = 0.05, k: int = 8192) -> list[tuple]:
    """Rows as 03_roofline.py makes them: (batch, fastest s, spread, flops, bytes) for batch 1..128."""
    return [(b, t, spread, 2 * b * k * k, 4 * (k * k + 2 * b * k)) for b, t in zip((1, 2, 4, 8, 16, 32, 64, 128), times)]


def test_lab_03_roofline_reads_its_doublings_and_ridges():
    f = lab_functions("03_roofline.py", "conclude", "ridges", "h200_reading")
    memory_then_compute = rows_of([10, 10.5, 11, 11.5, 12, 13, 26, 52])
    out = "\n".join(f.conclude(memory_then_compute))
    assert "memory-bound): up to batch 32; >= 1.7x (compute-bound): 64, 128" in out and "outlier" not in out
    assert "lasts longer" in out
    noisy = rows_of([10, 10.5, 11, 11.5, 12, 13, 26, 52])
    noisy[3] = (8, 11.5, 0.9, *noisy[3][3:])  # planted: the median pass at batch 8 was 90 % slower
    assert f.conclude(noisy)[0].startswith("inconclusive on this machine: the median pass at batch 8")
    flat = rows_of([1, 2, 4, 8, 16, 32, 64, 128])  # planted: every doubling costs 2x
    assert "no doubling cost < 1.5x: no memory-bound range" in "\n".join(f.conclude(flat))
    outlier = rows_of([5, 10, 10.5, 11, 11.5, 12, 13, 26])
    assert "batch 1 is an outlier: 1->2 cost 2.00x" in "\n".join(f.conclude(outlier))
    # ridges: an H200 (206 FLOP/byte, crossover ~206) against a CPU whose crossover is ~8, then ~1000
    assert "lasts longer (to batch ~206 against ~8)" in f.ridges(77e9, 20e9)
    assert "lasts shorter (to batch ~206 against ~1000)" in f.ridges(500e9, 1e9)
    # the GPU check: 1.54 s for 128 tokens -> at most 12.1 ms per decode step; a planted 0.01 s disagrees
    reading = f.h200_reading(1.54, 128, 64, 705e6, 4.8e12)
    assert "at most ~12.1 ms per decode step" in reading and "at least ~1.2%" in reading
    assert "not profile" in reading and "Python" not in reading
    assert "the inputs disagree" in f.h200_reading(0.01, 128, 64, 705e6, 4.8e12)


def test_lab_03_profile_splits_the_step_from_the_profile():
    f = lab_functions("03_profile.py", "verdict", "phases")
    assert f.verdict(5e-3, 5e-3, 1.2e-3) == "overhead-bound: 76% of the step is spent outside the operators"
    assert f.verdict(5e-3, 5e-3, 4e-3) == "operators-bound: 80% of the step is spent inside the operators"
    assert f.verdict(10e-3, 5e-3, 1.2e-3).startswith("inconclusive on this machine")  # planted: waited for a core
    assert f.verdict(10e-3, 1e-3, 1e-3, cuda=True).startswith("overhead-bound")  # wall vs CPU is no test on a GPU

    def ev(name, total=0.0, self_=0.0, parent=None):
        return SimpleNamespace(name=name, cpu_time_total=total, self_cpu_time_total=self_, self_device_time_total=0,
                               cpu_parent=parent)
    runner = ev("lab: runner", total=4000)
    mm = ev("aten::mm", total=900, self_=700, parent=runner)
    events = [runner, mm, ev("aten::t", 200, 200, parent=mm), ev("lab: scheduler", total=100), ev("aten::add", 50, 50)]
    got = f.phases(events, cuda=False)
    assert got["runner"] == pytest.approx([4000e-6, 900e-6]) and got["scheduler"] == [100e-6, 0.0]
    assert got["(no phase)"] == pytest.approx([0.0, 50e-6])


def test_lab_15_moves_only_what_the_intervals_separate_and_explains_ttft_from_its_numbers():
    f = lab_functions("15_measure.py", "verdict", "ratio_range", "explain", "prefill_flops")

    def row(ttft, tpot, e2el, ci=0.05):
        med = {"ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": e2el}
        return {"median": med, "tok/s": 1.0, "ci": {k: (v * (1 - ci), v * (1 + ci)) for k, v in med.items()}}
    lo, hi = row(50, 30, 80), row(400, 31, 430)
    said = f.verdict("prompt tokens", 16, 192, lo, hi)
    assert "moved (intervals apart): TTFT 8.0x, E2EL 5.4x" in said and "intervals overlap): TPOT" in said
    wide = row(400, 31, 430, ci=0.9)  # planted: intervals wide enough to cover both ends
    assert "nothing moved beyond its interval" in f.verdict("prompt tokens", 16, 192, lo, wide)

    mc = SimpleNamespace(head_dim=64, hidden_size=576, num_heads=9, num_kv_heads=3, intermediate_size=1536,
                         num_layers=30, vocab_size=49152)
    mm, at = f.prefill_flops(mc, 1024)
    assert at / mm == pytest.approx(0.167, abs=0.001)  # chapter 15: attention at 1,024 tokens, +17 % over the matmuls
    flops = {n: f.prefill_flops(mc, n) for n in (16, 1024)}
    by_flops = sum(flops[1024]) / sum(flops[16])
    timed = {16: (0.05, 0.002, 0.06), 1024: (2.0, 0.5, 2.4)}  # ratios 33-48 from the prefill times
    assert f.explain(16, 1024, flops, timed, by_flops, (by_flops * 0.9, by_flops * 1.1)).endswith(
        "the FLOPs explain the growth")
    assert "the prefill times do: at 1024 tokens attention ran at" in f.explain(16, 1024, flops, timed, 40, (35, 45))
    assert "unexplained on this machine" in f.explain(16, 1024, flops, timed, 93, (85, 100))  # planted: neither fits
    assert f.ratio_range(lo, hi) == pytest.approx((380 / 52.5, 420 / 47.5))


def test_lab_05_attention_checks_its_comparisons_against_a_stated_tolerance():
    f = lab_functions("05_attention.py", "agreement", "online_softmax", "tiled_attention")
    assert f.agreement("x and y", 3e-16, 8 * 2.2e-16).startswith("x and y: agree to rounding")
    assert f.agreement("x and y", 1e-3, 1e-5).startswith("x and y: DISAGREE (max |difference| 1.0e-03 > 1e-05)")
    import math

    import torch
    x = torch.tensor([1.0, 5.0, -2.0, 3.0, 9.0], dtype=torch.float64)
    assert (f.online_softmax(x, tile=2) - torch.softmax(x, 0)).abs().max() < 1e-15
    k = v = torch.eye(4, dtype=torch.float64)
    out, held = f.tiled_attention(torch.ones(4, dtype=torch.float64), k, v, tile=2)
    assert held == 2 and torch.allclose(out, torch.full((4,), 0.25, dtype=torch.float64))
    planted = f.online_softmax(x.clone(), tile=2)
    planted[0] += 1e-6  # an error the check must see
    assert "DISAGREE" in f.agreement("p", (planted - torch.softmax(x, 0)).abs().max().item(), 8 * 2.2e-16)
    assert math.isclose(float(out.sum()), 1.0)


def test_lab_17_quantize_reads_each_format_from_its_bytes_and_time():
    f = lab_functions("17_quantize.py", "verdicts", "q4_1_block")
    mib = 2**20
    rows = {"fp32": (0.016, 0.03, 256 * mib), "bf16": (0.015, 0.02, 128 * mib), "int8": (0.0055, 0.01, 64 * mib)}
    out = f.verdicts(rows, copy_gbs=24.0)
    assert out[0].startswith("fp32 (the baseline): 16.8 GB/s = 70% of the copy bandwidth, near")
    assert "bf16: 2x fewer bytes than fp32 and 1.07x its speed (no faster)" in out[1] and "at a fraction" in out[1]
    assert "int8: 4x fewer bytes than fp32 and 2.91x its speed (faster)" in out[2]
    slow = dict(rows, int8=(0.075, 0.01, 64 * mib))  # planted: the int8 product slower than fp32
    assert "(slower)" in f.verdicts(slow, 24.0)[2] and "its kernel, not memory, sets the time" in f.verdicts(slow, 24.0)[2]
    noisy = dict(rows, bf16=(0.015, 0.8, 128 * mib))  # planted: the median bf16 pass 80 % above its fastest
    assert f.verdicts(noisy, 24.0)[0].startswith("inconclusive on this machine: the median bf16 pass")
    import numpy as np
    raw = np.float16(0.5).tobytes() + np.float16(-1.0).tobytes() + bytes([0x10] * 16)  # codes 0 (low) and 1 (high)
    w = f.q4_1_block(raw)
    assert w[:16].tolist() == [-1.0] * 16 and w[16:].tolist() == [-0.5] * 16


def test_lab_16_parallel_explains_the_all_reduce_share_from_its_numbers():
    f = lab_functions("16_parallel.py", "explain", "ring_estimate")
    assert f.ring_estimate(4608, 2, 20.0) == pytest.approx(4608 / 20e9)  # 2 (N - 1) / N = 1 at N = 2
    assert f.ring_estimate(8192, 8, 450.0) == pytest.approx(1.75 * 8192 / 450e9)
    waiting = f.explain(0.59, 0.0001, per_call=1086e-6, bare_call=337e-6)
    assert waiting.startswith("measured 59% against 0.01% estimated") and "749 us of each call is rank 0 waiting" in waiting
    latency = f.explain(0.59, 0.0001, per_call=400e-6, bare_call=337e-6)  # planted: the engine's call costs what a bare one does
    assert "per-message latency (two processes meeting over loopback TCP) is most of it" in latency
    assert f.explain(0.02, 0.015, per_call=1e-5, bare_call=1e-5) == "the bytes explain the all-reduce time"  # planted: big messages


def test_lab_04_decode_reads_its_timing_ratios():
    f = lab_functions("04_decode.py", "verdict")
    assert f.verdict([2.0, 2.5, 3.0, 2.2], 24).startswith("decode with the cache was faster at every step: "
                                                           "recompute / decode = 2.35x median")
    assert "inconclusive on this machine" in f.verdict([2.0, 0.9, 3.0, 2.2], 24)  # planted: one step the other way
    assert f.verdict([0.5, 0.6, 0.7], 24).startswith("the full recompute was faster")


def test_lab_13_says_what_greedy_verify_returned():
    f = lab_functions("13_speculative.py", "verified")
    assert f.verified([4, 9, 7, 5], [4, 9, 9], [4, 9, 7]).endswith(
        "(2 drafts accepted, then the target's own token: 3 tokens from one pass)")
    rejected = f.verified([4, 9, 7, 5], [1, 9, 9], [4])  # planted: the first draft is wrong
    assert rejected.endswith("(0 drafts accepted, then the target's own token: 1 token from one pass)")
    assert "(3 drafts accepted, then the target's own token: 4 tokens" in f.verified([4, 9, 7, 5], [4, 9, 7], [4, 9, 7, 5])


def test_lab_18_names_a_side_only_where_the_repeats_separate():
    f = lab_functions("18_disaggregate.py", "verdict")
    coloc = [{"mean": 4.2, "max": 40.0}, {"mean": 4.4, "max": 52.0}, {"mean": 4.3, "max": 38.0}]
    disagg = [{"mean": 1.9, "max": 3.6}, {"mean": 2.0, "max": 3.9}, {"mean": 1.95, "max": 3.5}]
    said = f.verdict(coloc, disagg)
    assert said.startswith("mean ITL: disaggregated lower (2.1x at least; colocated 4.20-4.40 ms, disaggregated 1.90-2.00 ms)")
    assert "longest ITL: disaggregated lower (9.7x at least" in said
    swapped = f.verdict(disagg, coloc)  # planted: the colocated engine's repeats all faster
    assert swapped.startswith("mean ITL: colocated lower (2.1x at least") and "longest ITL: colocated lower" in swapped
    noisy = disagg[:2] + [{"mean": 5.0, "max": 45.0}]  # planted: one disaggregated repeat as slow as colocated
    assert f.verdict(coloc, noisy) == ("mean ITL: inconclusive on this machine (the repeats overlap: colocated 4.20-4.40 ms, "
                                       "disaggregated 1.90-5.00 ms); longest ITL: inconclusive on this machine (the repeats "
                                       "overlap: colocated 38.00-52.00 ms, disaggregated 3.60-45.00 ms)")


def test_lab_19_reads_intensity_from_the_routing_and_times_from_the_passes():
    f = lab_functions("19_moe.py", "intensity", "gemm_verdict", "sends")
    assert f.intensity(16, 4, 39) == (64 / 39, 16.0)  # 39 experts read for 16 x 4 rows; dense: the batch
    assert f.intensity(256, 4, 60) == (256 * 4 / 60, 256.0)  # every expert read: E / k lower
    assert f.intensity(1, 4, 4) == (1.0, 1.0)  # one token: the same weights as a dense layer of its active size
    fast = f.gemm_verdict(16, "grouped_mm", [4.2e-3, 4.3e-3, 4.4e-3], [3.0e-3, 3.1e-3, 3.2e-3])
    assert fast == "batch 16: grouped_mm 1.4x faster than the loop (3.00 vs 4.20 ms)"
    slow = f.gemm_verdict(16, "the padded bmm", [4.2e-3] * 3, [8.0e-3, 8.1e-3, 8.2e-3])  # planted: the grouped side slower
    assert slow == "batch 16: the padded bmm 1.9x slower than the loop (8.00 vs 4.20 ms)"
    assert "as fast as the loop, within 1.2x" in f.gemm_verdict(16, "grouped_mm", [4.2e-3] * 3, [4.0e-3] * 3)
    noisy = f.gemm_verdict(16, "grouped_mm", [4.2e-3, 9.0e-3, 9.5e-3], [3.0e-3] * 3)  # planted: the median loop pass 114 % up
    assert noisy == ("batch 16, grouped_mm against the loop: inconclusive on this machine (the median pass of the loop is "
                     "114% above its fastest)")
    import torch
    idx = torch.tensor([[0, 1], [0, 2], [2, 3]])  # 2 experts per device over 2 devices; token t lives on device t % 2
    assert f.sends(idx, 2, 2) == (6, 4, 2)  # token 0 sends one copy (both experts on device 0), tokens 1, 2 two each


def test_lab_20_names_the_faster_side_only_where_the_repeats_separate():
    f = lab_functions("20_kv_tiers.py", "verdict")
    assert f.verdict([4.8, 5.1, 5.4], [18.0, 20.0, 18.3]) == (
        "the file tier cut the returning turns' TTFT 3.3x at least (with the tier 4.8-5.4 ms, without 18.0-20.0 ms)")
    slower = f.verdict([18.0, 20.0, 18.3], [4.8, 5.1, 5.4])  # planted: reading the file slower than recomputing
    assert slower.startswith("reading the file was slower than recomputing: the returning turns' TTFT rose 3.3x at least")
    assert f.verdict([4.8, 19.0, 5.4], [18.0, 20.0, 18.3]).startswith("inconclusive on this machine")  # planted: one slow repeat
