"""bench.json -> the markdown tables docs/perf/2026-12-04-simulate.md quotes (`python -m
experiments.simulate.bench_md results/simulate-bench/bench.json`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

STATS = ("p50", "p90", "p99")


def pct(v) -> str:
    return "–" if v is None else f"{v:+.1%}"


def served_table(levels: dict) -> list[str]:
    out = ["| level | TTFT p50 / p90 / p99 | TPOT p50 / p90 / p99 | E2EL p50 / p90 / p99 | throughput | "
           "measured TTFT p50, TPOT p50 (ms), tok/s |", "|---|---|---|---|---|---|"]
    for lv, d in levels.items():
        e, m = d["errors"], d["measured"]
        cells = [" / ".join(pct(e[f"{k}_{s}"]) for s in STATS) for k in ("ttft", "tpot", "e2el")]
        out.append(f"| {lv} | " + " | ".join(cells) + f" | {pct(e['throughput'])} | "
                   f"{m['ttft_ms']['median']:.0f}, {m['tpot_ms']['median']:.1f}, {m['output_throughput']:.1f} |")
    return out


def render(res: dict) -> str:
    p, tf = res["profile"], res["teacher_forced"]
    md = [f"Profile: {p['name']} ({p['machine']}), coefficients "
          + ", ".join(f"{k} {v:.3g}" for k, v in p["coef"].items())
          + f"; peaks {p['bandwidth_gbps']:.1f} GB/s, {list(p['tflops'].values())[0] * 1e3:.1f} GFLOP/s; "
          f"sweep fit |error| median {p['fit']['sweep']['median_abs']:.1%}, p90 {p['fit']['sweep']['p90_abs']:.1%} "
          f"over {p['fit']['sweep']['steps']} steps.", "",
          "| teacher-forced steps | n | median abs error | p90 abs error | median signed |", "|---|---|---|---|---|"]
    for k, v in tf.items():
        if v.get("steps"):
            md.append(f"| {k} | {v['steps']} | {v['median_abs']:.1%} | {v['p90_abs']:.1%} | {v['median_signed']:+.1%} |")
    md += ["", "Closed loop (error = predicted / measured - 1):", ""] + served_table(res["served"])
    if res.get("poisson"):
        md += ["", "Poisson at 50 / 85 / 95 % of the measured search capacity:", ""] + served_table(res["poisson"])
    c = res["capacity"]
    if c.get("measured") and c.get("predicted"):
        md += ["", f"SLO-search capacity: measured {c['measured']:g} req/s, simulated {c['predicted']:g} req/s "
               f"({pct(c['predicted'] / c['measured'] - 1)})."]
    if res.get("published"):
        md += ["", "| ISL/OSL | requests | predicted tok/s (H200, uncalibrated) | TensorRT-LLM | ratio | "
               "preemptions | simulator s |", "|---|---|---|---|---|---|---|"]
        for r in res["published"]["rows"]:
            md.append(f"| {r['isl']}/{r['osl']} | {r['requests']} | {r['predicted_tok_s']:,.0f} | "
                      f"{r['published_tok_s']:,.0f} | {r['ratio']:.2f} | {r['preemptions']} | "
                      f"{r['simulator_wall_s']:.0f} |")
    if res.get("at_scale"):
        md += ["", "| router | requests | replicas | rate | TTFT p50 / p99 ms | TPOT p50 / p99 ms | prefix hits | "
               "KV peak | preemptions | stepping min-max | simulator s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["at_scale"]:
            md.append(f"| {r['router']} | {r['requests']:,} | {r['replicas']} | {r['rate']:g} | "
                      f"{r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.1f} | {r['tpot_p50_ms']:.2f} / "
                      f"{r['tpot_p99_ms']:.2f} | {r['prefix_hit_rate']:.0%} | {r['kv_peak_max']:.0%} | "
                      f"{r['preemptions']} | {r['busy_min']:.0%}-{r['busy_max']:.0%} | {r['simulator_wall_s']:.0f} |")
    md += ["", f"Load average (1/5/15 min) at start {res['load_at_start']}, at end {res.get('load_at_end')}; "
           f"per phase: " + "; ".join(f"{k}: {tuple(round(x, 1) for x in v)}"
                                      for k, v in (res.get("load_by_phase") or {}).items())]
    return "\n".join(md)


if __name__ == "__main__":
    print(render(json.loads(Path(sys.argv[1]).read_text())))
