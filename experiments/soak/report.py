"""The soak's page (markdown) and its plot (a PNG beside it).

`write(md_path, ctx)`: ctx holds the command, start time, commit, machine, server command and
effective settings, the rate and where it came from, the verdict lines, the records, the samples,
the windows and the run folder. The plot: RSS with its fitted slope, KV blocks in use, and the
p50 / p99 TTFT and TPOT of each sample period, with the warm-up and both windows shaded.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from experiments.soak.mix import DECK
from experiments.soak.verdict import rss_slope


def traffic_table(records: list[dict]) -> list[str]:
    out = ["| kind | sent | 2xx | 4xx | 5xx | transport errors | cut by the client | output tokens |",
           "|---|---|---|---|---|---|---|---|"]
    for kind in ["warmup", *DECK, "probe"]:
        rs = [r for r in records if r["kind"] == kind]
        if not rs:
            continue
        st = Counter((r["status"] or 0) // 100 for r in rs)
        transport = sum(str(r["error"] or "").startswith("transport") for r in rs)
        out.append(f"| {kind} | {len(rs)} | {st[2]} | {st[4]} | {st[5]} | {transport} | {sum(r['cut'] for r in rs)} | "
                   f"{sum(len(r['output_token_ids']) for r in rs):,} |")
    inv = Counter(f"{r['name']} -> {r['status']}" for r in records if r["kind"] == "invalid")
    if inv:
        out += ["", "Invalid requests (name -> status: count): "
                + ", ".join(f"{k}: {v}" for k, v in sorted(inv.items()))]
    return out


def samples_table(rows: list[dict], max_rows: int = 40) -> list[str]:
    step = max(1, -(-len(rows) // max_rows))
    keys = ("t_s", "rss_mib", "kv_blocks_used", "running", "waiting", "finished", "ttft_p99_ms", "tpot_p99_ms")
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows[::step] + ([rows[-1]] if rows and (len(rows) - 1) % step else []):
        out.append("| " + " | ".join("–" if r.get(k) is None else f"{r[k]:.0f}" if isinstance(r[k], float) and
                                     k.endswith("_ms") else str(r[k]) for k in keys) + " |")
    return out


def plot(png: Path, rows: list[dict], warm: float, first: tuple, last: tuple) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] / 60 for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    series = [("RSS of the server tree (MiB)", ["rss_mib"]), ("KV blocks in use", ["kv_blocks_used"]),
              ("TTFT per sample period (ms)", ["ttft_p50_ms", "ttft_p99_ms"]),
              ("TPOT per sample period (ms)", ["tpot_p50_ms", "tpot_p99_ms"])]
    for ax, (title, keys) in zip(axes, series):
        for k in keys:
            ax.plot(t, [float("nan") if r.get(k) is None else r[k] for r in rows], marker=".", lw=1,
                    label=k.replace("_ms", "").replace("_", " "))
        ax.axvspan(0, warm / 60, color="0.9", label="warm-up")
        ax.axvspan(first[0] / 60, first[1] / 60, color="tab:green", alpha=0.1, label="first window")
        ax.axvspan(last[0] / 60, last[1] / 60, color="tab:red", alpha=0.1, label="last window")
        ax.set_title(title, fontsize=9)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")  # RSS moves by KiB on GiB: no offset
        ax.legend(fontsize=7, loc="upper left")
    slope = rss_slope(rows, warm)
    after = [(r["t_s"] / 60, r["rss_mib"]) for r in rows if r["t_s"] >= warm and r["rss_mib"] > 0]
    if slope is not None:
        import numpy as np

        x, y = np.array(after).T
        b = np.polyfit(x, y, 1)
        axes[0].plot(x, np.polyval(b, x), "k--", lw=1, label=f"fit {slope:+.3f} MiB/min")
        axes[0].legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("minutes since the soak started")
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def write(md: Path, ctx: dict) -> None:
    png = md.with_suffix(".png")
    plot(png, ctx["rows"], *ctx["windows"])
    warm, first, last = ctx["windows"]
    hw = ctx["hardware"]
    lines = [f"# Soak: `inferlab serve` on {ctx['model_name']}, {ctx['minutes']:g} min at {ctx['rate']:g} req/s"
             + (" (mechanism run)" if ctx["mechanism"] else ""), "",
             f"Command: `{ctx['command']}`  ",
             f"Started {ctx['started']}; commit {ctx['commit']}; {hw['cpu']}, {hw['cores_logical']} logical cores, "
             f"{hw['ram_bytes'] / 2**30:.0f} GiB RAM; load average before {ctx['load_before']}, "
             f"after {ctx['load_after']}.  ",
             f"Raw samples and requests: `{ctx['run_dir']}` (outside git).", "",
             "## Verdicts", "", "```", *ctx["verdict_lines"], "```", "",
             f"Windows: warm-up {warm:.0f} s; first window {first[0]:.0f}-{first[1]:.0f} s, "
             f"last {last[0]:.0f}-{last[1]:.0f} s "
             "(runs of 10 min or more: min(5 min, 20 %) warm-up, 5-minute windows; shorter runs: 20 % warm-up and "
             "quarter-run windows). Latency windows read the interactive requests (chat, multi-turn) that finished "
             "whole, by send time; 5xx counts every phase (search, probes, soak).", "",
             "## Server", "", f"`{ctx['server_command']}`", "",
             "Effective settings (its /server_info): " + ", ".join(f"{k} {v}" for k, v in ctx["effective"].items()), "",
             "## Rate", "", ctx["rate_note"], ""]
    if ctx.get("search"):
        s = ctx["search"]
        lines += [f"SLO search (experiments.running.search's bracketing; TTFT <= {s['slo']['ttft_ms']:g} ms, TPOT <= "
                  f"{s['slo']['tpot_ms']:g} ms for >= {s['goodput']:.0%} of the interactive requests, "
                  f"{s['level_s']:g} s per level):",
                  "", "| rate (req/s) | requests | judged | within SLO | verdict |", "|---|---|---|---|---|"]
        lines += [f"| {p['rate']:g} | {p['requests']} | {p['judged']} | {p['goodput_fraction']:.0%} | "
                  f"{'pass' if p['passed'] else 'fail'} |" for p in s["points"]] + [""]
    lines += ["## Traffic", "", *traffic_table(ctx["records"]), "", ctx["end_note"], "",
              f"## Samples (every {ctx['sample_s']:g} s; at most 40 rows shown)", "", *samples_table(ctx["rows"]), "",
              f"![soak]({png.name})", ""]
    md.write_text("\n".join(lines))
