"""The frontier section: each engine's output tokens per second per device against interactivity (tok/s per
user), over every cell and level of the runs (experiments/measuring/frontier.py says how a frontier is
found and read), with cost, energy, the hardware each point ran on and why each sweep stopped.
Writes `frontier.csv` and `frontier.json` beside the page and `plots/frontier.png`."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.measuring import energy, intervals  # noqa: E402
from experiments.measuring.frontier import Point, cost_per_m, frontiers, interactivity, read_at  # noqa: E402
from experiments.report.md import fmt, table  # noqa: E402
from experiments.report.plots import colour_map  # noqa: E402

CSV_FIELDS = ("engine", "cell", "level", "on_frontier", "interactivity", "output_per_device", "output_ci_lo",
              "output_ci_hi", "ci_basis", "total_per_device", "ttft_p50_ms", "ttft_p99_ms", "devices", "per",
              "cost_per_m_output", "joules_per_output_token", "client_lateness_p99_ms", "machine", "engine_version")


def points(runs: Any, cell: str | None, price: float | None) -> list[Point]:
    """One point per engine and level that has a TPOT (a level of one-token answers has none)."""
    out = []
    for e in runs.engines:
        dev = e.manifest.get("devices") or {"count": 1, "per": "per engine (devices not recorded)"}
        n, info, hw = dev.get("count") or 1, e.manifest.get("info") or {}, e.manifest.get("hardware") or {}
        for level, s in e.summary.items():
            x, out_tps = interactivity((s.get("tpot_ms") or {}).get("median")), s.get("output_throughput")
            if x is None or not out_tps:
                continue
            ci = (s.get("ci") or {}).get("output_throughput")
            late = (s.get("client_lateness_ms") or {}).get("p99")
            extra = {"ttft_p50_ms": (s.get("ttft_ms") or {}).get("median"), "ttft_p99_ms": (s.get("ttft_ms") or {}).get("p99"),
                     "devices": n, "per": dev.get("per"), "device_model": dev.get("model"), "driver": dev.get("driver"),
                     "machine": machine(hw, dev), "engine_version": info.get("version"),
                     "launch_command": (info.get("effective") or {}).get("launch_command"),
                     "env": (e.manifest.get("options") or {}).get("env") or {},
                     "joules_per_output_token": s.get("joules_per_output_token"),
                     "energy_source": "; ".join(x for x in ((s.get("energy") or {}).get("source"),
                                                            (s.get("energy") or {}).get("scope")) if x),
                     "client_lateness_p99_ms": late,
                     "simulated": (e.manifest.get("simulated") or {}).get("profile")}
            p = Point(e.label, cell, level, x, out_tps / n,
                      s["total_throughput"] / n if s.get("total_throughput") else None,
                      (ci[0] / n, ci[1] / n) if ci else None, s.get("throughput_ci_basis") if ci else None, extra)
            p.extra["cost_per_m_output"] = cost_per_m(p.output, price)
            out.append(p)
    return out


def machine(hw: dict[str, Any], dev: dict[str, Any]) -> str:
    """A short name for the machine a point ran on (merged runs from several machines stay told apart)."""
    if dev.get("kind") == "gpu":
        return f"{dev.get('model')} (driver {dev.get('driver') or '?'})"
    return f"{hw.get('cpu', '?')}, {hw.get('cores_logical', '?')} cores"


def price(cfg: dict[str, Any], runs_list: list[Any]) -> tuple[float | None, str]:
    """The price per device-hour and where it came from: the config's per-device price, else its machine price
    over the machine's devices (GPUs, or logical cores on a CPU host); never both (the config refuses that)."""
    given = (cfg.get("frontier") or {}).get("price_per_device_hour")
    if given is not None:
        return given, f"${given:g} per device-hour (frontier.price_per_device_hour)"
    machine_price = cfg.get("cost_per_hour")
    if machine_price is None:
        return None, "no price in the config (frontier.price_per_device_hour or cost_per_hour)"
    hw = next((e.manifest.get("hardware") for r in runs_list for e in r.engines if e.manifest.get("hardware")), {})
    n, what = (len(hw["gpus"]), "GPUs") if hw.get("gpus") else (hw.get("cores_logical") or 1, "cores")
    return machine_price / n, (f"${machine_price / n:.4g} per device-hour (cost_per_hour ${machine_price:g} for this "
                               f"machine over its {n} {what})")


def stops(runs: Any, cell: str | None) -> list[str]:
    """Why each engine's sweep stopped, per repeat, with its refined levels and client-bound levels."""
    lines = []
    for e in runs.engines:
        for r, rep in sorted((e.manifest.get("repeats") or {}).items()):
            sw = rep.get("sweep")
            if not sw:
                continue
            where = " / ".join(x for x in (e.label, cell, f"repeat {r}") if x)
            bound = [p["level"] for p in sw.get("points", []) if p.get("client_bound")]
            lines.append(f"- {where}: levels {', '.join(str(p['concurrency']) for p in sw.get('points', []))}; "
                         f"stopped: {sw.get('stopped') or 'not (it failed or was cut short: see the engine status)'}"
                         + (f"; refined at {', '.join(map(str, sw['refined']))}" if sw.get("refined") else "")
                         + (f"; **client-bound levels: {', '.join(bound)}**" if bound else ""))
    return lines


def plot(pts: list[Point], fronts: dict[str, list[Point]], targets: list[float], out: Path) -> Path:
    colour = colour_map(list(fronts))
    fig, ax = plt.subplots(figsize=(8, 5))
    for t in targets:  # where the engines are read
        ax.axvline(t, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"{t:g} tok/s/user", (t, 0), xytext=(2, 2), textcoords="offset points", fontsize=7, color="grey",
                    xycoords=("data", "axes fraction"))
    for eng, front in fronts.items():
        mine = [p for p in pts if p.engine == eng]
        dashed = any(p.extra.get("simulated") for p in mine)
        ax.scatter([p.interactivity for p in mine], [p.output for p in mine], color=colour[eng], alpha=0.35, s=18)
        profile = next((p.extra["simulated"] for p in mine if p.extra.get("simulated")), None)
        ax.plot([p.interactivity for p in front], [p.output for p in front], marker="o", color=colour[eng],
                linestyle="--" if dashed else "-", label=eng + (f" (predicted: {profile})" if dashed else ""))
        for p in mine:
            ax.annotate(p.name.replace("concurrency=", "c="), (p.interactivity, p.output), fontsize=6,
                        xytext=(3, 3), textcoords="offset points", color=colour[eng])
    per = {p.extra.get("per", "") for p in pts}
    ax.set_xlabel("interactivity: output tok/s per user (1000 / TPOT p50)")
    ax.set_ylabel("output tok/s per device" + (f"\n({per.pop()})" if len(per) == 1 else ""))
    ax.set_title("throughput per device against interactivity (lines: each engine's frontier)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "plots" / "frontier.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def section(cells: list[tuple[str | None, Any]], cfg: dict[str, Any], out: Path) -> list[str]:
    """The page's frontier section over `cells` ((cell name or None, summarized Runs) each); [] without points."""
    pr, pr_said = price(cfg, [r for _, r in cells])
    pts = [p for cell, runs in cells for p in points(runs, cell, pr)]
    if not pts:
        return []
    fronts = frontiers(pts)
    on = {id(p) for f in fronts.values() for p in f}
    targets = (cfg.get("frontier") or {}).get("interactivity") or []
    png = plot(pts, fronts, targets, out)
    reads = {t: {e: read_at(f, t) for e, f in fronts.items()} for t in targets}
    bases = sorted({p.ci_basis for p in pts if p.ci_basis})
    md = ["## The frontier: throughput per device against interactivity", "",
          "Each point is one load level of one cell: interactivity = 1000 / TPOT p50 (output tok/s one user sees), "
          "against output tokens per second per device. A line joins each engine's frontier: the points no other "
          "point of the same engine beats on both axes (its cells and levels together). Per device: "
          + "; ".join(sorted({f"{p.engine}: {p.extra.get('per')}" for p in pts})) + ".",
          "", f"![frontier](plots/{png.name})", "",
          "Intervals (95 %): " + (" and ".join({"repeats": "from the repeats of each level",
                                                "windows": "from the per-window throughput inside each sustained level "
                                                           "(one run)"}[b] for b in bases) if bases else "none (one run, "
                                  "levels not sustained)") + ". Cost at " + pr_said + ".", "",
          "### Frontier points", ""]
    rows = [[p.engine, p.name, fmt(p.interactivity, 1), _with_ci(p.output, p.output_ci), fmt(p.total, 1),
             f"{fmt(p.extra['ttft_p50_ms'], 0)} / {fmt(p.extra['ttft_p99_ms'], 0)}", fmt(p.extra["cost_per_m_output"], 3),
             fmt(p.extra["joules_per_output_token"], 3), p.extra["machine"]]
            for f in fronts.values() for p in f]
    md += table(["engine", "cell / level", "tok/s per user", "output tok/s per device", "total tok/s per device",
                 "TTFT p50 / p99 (ms)", "$ per M output tokens", "J per output token", "machine"], rows) + [""]
    if targets:
        md += ["### Read at a target interactivity", "",
               "Each engine's output tok/s per device at the target, interpolated linearly between the two frontier "
               "points around it (its interval too; the interactivity's own spread is not in it). A target outside "
               "an engine's measured range is said to be so, never extrapolated. An engine is ranked above another "
               "only where their intervals do not overlap.", ""]
        trows, verdicts = [], []
        for t, by in reads.items():
            for eng, rd in by.items():
                trows.append([f"{t:g}", eng, _with_ci(rd.output, rd.ci) if rd.output is not None else rd.why,
                              " .. ".join(rd.between) if rd.between else "–", fmt(cost_per_m(rd.output, pr), 3)])
            cands = {e: (rd.output, *(rd.ci or (rd.output, rd.output))) for e, rd in by.items() if rd.output is not None}
            w = intervals.winner(cands, True)
            verdicts.append(f"- at {t:g} tok/s per user: " + (f"**{w['winner']}** ahead of {', '.join(w['beats'])}"
                                                               + (f" (tied with {', '.join(w['ties'])})" if w["ties"] else "")
                                                               if w["winner"] else "no engine ahead (intervals overlap, "
                                                               "or fewer than two engines reach it)"))
        md += table(["target (tok/s per user)", "engine", "output tok/s per device", "between", "$ per M output tokens"],
                    trows) + [""] + verdicts + [""]
    md += ["### Energy", ""] + sorted({f"- {p.engine}: {p.extra.get('energy_source') or energy.NOT_REPORTED}"
                                      for p in pts}) + [""]
    why = [ln for cell, runs in cells for ln in stops(runs, cell)]
    if why:
        md += ["### Why each sweep stopped", ""] + why + [""]
    md += ["### What each point ran on", ""]
    md += sorted({f"- {' / '.join(x for x in (p.engine, p.cell) if x)}: {p.extra['machine']}; {p.extra['devices']} "
                  f"devices, {p.extra['per']}; engine {p.extra.get('engine_version') or '?'}; "
                  f"`{p.extra.get('launch_command') or 'in-process'}`"
                  + "".join(f" with {k}={v}" for k, v in sorted(p.extra["env"].items()))
                  for p in pts}) + [""]
    write(pts, on, reads, pr_said, out)
    md += ["The same points as data: [frontier.csv](frontier.csv), [frontier.json](frontier.json).", ""]
    return md


def _with_ci(v: float | None, ci: tuple[float, float] | None) -> str:
    return fmt(v, 1) + (f" [{fmt(ci[0], 1)}–{fmt(ci[1], 1)}]" if ci else "")


def write(pts: list[Point], on: set[int], reads: dict, price_said: str, out: Path) -> None:
    rows = []
    for p in pts:
        rows.append({"engine": p.engine, "cell": p.cell, "level": p.level, "on_frontier": id(p) in on,
                     "interactivity": p.interactivity, "output_per_device": p.output,
                     "output_ci_lo": p.output_ci[0] if p.output_ci else None,
                     "output_ci_hi": p.output_ci[1] if p.output_ci else None, "ci_basis": p.ci_basis,
                     "total_per_device": p.total, **{k: p.extra.get(k) for k in CSV_FIELDS if k in p.extra}})
    with (out / "frontier.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(CSV_FIELDS), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    data = {"price": price_said, "points": [{**r, **{k: v for k, v in p.extra.items() if k not in r}}
                                            for r, p in zip(rows, pts)],
            "targets": {str(t): {e: vars(rd) for e, rd in by.items()} for t, by in reads.items()}}
    (out / "frontier.json").write_text(json.dumps(data, indent=1, default=str))
