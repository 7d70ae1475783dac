"""A held-out round's record tables (validate.py's report phase writes them as round.md): the teacher-forced step
errors, the drift control and the anchors, the speed probe and the control per phase, each level's errors with
their bootstrap intervals, the capacity and the served steps."""
from __future__ import annotations


def _pct(v) -> str:
    return "–" if v is None else f"{v:+.1%}"


def markdown(res: dict) -> str:
    """round.json as the record's tables: the step level, each level's errors with intervals, the capacity."""
    md = ["| teacher-forced steps (held-out model, in-process) | steps | median abs error | p90 abs error | median signed |",
          "|---|---|---|---|---|"]
    for k, e in (res.get("teacher_forced") or {}).items():
        if k not in ("shares", "control", "two_models", "unanchored") and e.get("steps"):
            md.append(f"| {k} | {e['steps']} | {e['median_abs']:.1%} | {e['p90_abs']:.1%} | {e.get('median_signed', 0):+.1%} |")
    two = (res.get("teacher_forced") or {}).get("two_models") or {}
    if two:
        md.append("\nFitted on the sweep's first two models only (" + " and ".join(two["fitted_on"]) + "), the held-out "
                  "decode steps: " + ", ".join(f"{k.split(':')[0]} {v['median_signed']:+.1%}" for k, v in two.items()
                                               if k != "fitted_on" and v.get("steps")) + " (median signed).")
    un = (res.get("teacher_forced") or {}).get("unanchored") or {}
    if un:
        md.append("\nAgainst the profile as calibrated (not anchored), the same decode steps: " + ", ".join(
            f"{k.split(':')[0]} {v['median_signed']:+.1%}" for k, v in un.items() if v.get("steps")) + " (median signed).")
    for tag, x in (res.get("anchors") or {}).items():
        served = x.get("how") == "served step log"  # round 8 on: the servers' decode steps, per process too
        md.append(f"\nAnchored for {tag} at {x['utc']} on {x['model']}: "
                  f"{'served decode steps (median)' if served else 'one-row decode'} " + ", ".join(
            f"{y['measured_ms']:.2f} ms measured, {y['predicted_ms']:.2f} ms as calibrated"
            + (" (per process " + " / ".join(f"{v:.2f}" for v in y["per_process_ms"].values()) + " ms)"
               if y.get("per_process_ms") else "")
            for y in x.get("per_model") or [x]) + f": memory terms x{x['factor']:.3f}"
            + (f"; its server processes {x['spread']:.0%} apart in speed." if "spread" in x else "."))
    control = (res.get("teacher_forced") or {}).get("control") or []
    for c in control:
        md.append(f"\nDrift control at {c['utc']}: {c['model']}'s one-row decode {c['measured_ms']:.2f} ms measured, "
                  f"{c['predicted_ms']:.2f} ms predicted ({c['error']:+.1%}: the machine against its calibration).")
    # the control is timed against the profile as calibrated, so an anchored round divides the un-anchored error
    tf = (res.get("teacher_forced") or {})
    dec = ((tf.get("unanchored") or tf).get("1 streams: decode") or {}).get("median_signed")
    if control and dec is not None:
        c = sum(x["error"] for x in control) / len(control)
        md.append(f"\nThe held-out model's 1-stream decode error{' as calibrated' if tf.get('unanchored') else ''} "
                  f"against the control's: (1 {dec:+.1%}) / (1 {c:+.1%}) - 1 = {(1 + dec) / (1 + c) - 1:+.1%} "
                  f"(transfer, with the drift divided out).")
    probes = {k: v for k, v in (res.get("load") or {}).items() if "gemm_pass_ms" in v.get("start", {})}
    if probes:
        md += ["", "| phase | start (UTC) | speed probe, ms | end (UTC) | speed probe, ms |", "|---|---|---|---|---|"]
        md += [f"| {k} | {v['start']['utc']} | {v['start']['gemm_pass_ms']:.1f} | {v.get('end', {}).get('utc', '–')} | "
               f"{v.get('end', {}).get('gemm_pass_ms', float('nan')):.1f} |" for k, v in probes.items()]
        ctl = {k: v for k, v in probes.items() if "control_ms" in v["start"]}
        if ctl:
            md += ["", "| phase | control at start, ms (error as calibrated) | control at end, ms |", "|---|---|---|"]
            md += [f"| {k} | {v['start']['control_ms']:.1f} ({v['start']['control_error']:+.1%}) | "
                   + (f"{v['end']['control_ms']:.1f} ({v['end']['control_error']:+.1%})" if "control_ms" in
                      v.get("end", {}) else "–") + " |" for k, v in ctl.items()]
    for k, parts in ((res.get("teacher_forced") or {}).get("shares") or {}).items():
        md.append(f"\nHeld-out model, {k} at context 1024: {parts['seconds'] * 1e3:.2f} ms predicted = " + ", ".join(
            f"{t} {v:.0%}" for t, v in parts.items() if t != "seconds" and v >= 0.005))
    for n, levels in res.items():
        if not isinstance(levels, dict) or not n.startswith("heldout"):
            continue
        md += ["", f"**{n}** (error = predicted / measured - 1; 95 % bootstrap interval; resolvable: half-width < 10 %)",
               "", "| level | metric | measured | predicted | error | 95 % interval | resolvable | within 10 % |",
               "|---|---|---|---|---|---|---|---|"]
        for lv, row in levels.items():
            for key in ("ttft_p50", "tpot_p50", "throughput"):
                r = row[key]
                ci = r.get("interval")
                md.append(f"| {lv} | {key} | {r['measured']:.1f} | {r['predicted']:.1f} | {_pct(r['error'])} | "
                          + (f"[{ci[0]:+.1%}, {ci[1]:+.1%}] | {'yes' if r['resolvable'] else 'no'}" if ci else "– | –")
                          + f" | {'yes' if r['error'] is not None and abs(r['error']) <= 0.10 else 'NO'} |")
            if len(row.get("per_process") or {}) > 1:  # a pooled p50 can sit between processes' speeds
                md.append(f"| {lv} | measured p50 per server process | " + "; ".join(
                    f"TTFT {v['ttft_p50']:.1f} / TPOT {v['tpot_p50']:.1f} ms" for v in row["per_process"].values()
                    if v.get("ttft_p50") is not None and v.get("tpot_p50") is not None) + " | | | | | |")
    for key, what in (("capacity", ""), ("capacity_unanchored", ", un-anchored")):
        cap = res.get(key)
        if cap:
            met = cap["error"] is not None and abs(cap["error"]) <= 0.15
            md += ["", (f"Capacity (SLO search{what}): measured {cap['measured']} req/s, predicted {cap['predicted']} "
                        f"req/s, error {_pct(cap['error'])} (bar 15 %: {'met' if met else 'MISSED'}).")]
            if cap.get("measured_interval"):  # round 7 on: the levels' counts redrawn (report/predicted.py)
                mi, pi, ci = cap["measured_interval"], cap["predicted_interval"], cap.get("interval")
                md.append(f"95 % intervals from the levels' counts: measured {mi[0]:g}-{mi[1]:g} req/s, predicted "
                          f"{pi[0]:g}-{pi[1]:g} req/s, error " + (f"[{ci[0]:+.1%}, {ci[1]:+.1%}] (15 % "
                          f"{'resolvable' if cap['resolvable'] else 'not resolvable'}; {cap.get('decided', '–')})" if ci else "–") + ".")
            pts = cap.get("points") or {}
            for side, ps in pts.items():
                md.append(f"{side} levels (rate: in SLO / sent): " + ", ".join(
                    f"{p['rate']:g}: {round(p['goodput_fraction'] * p['requests'])}/{p['requests']}" for p in ps) + ".")
    for n, st in (res.get("served_steps") or {}).items():
        a = st.get("all") or {}
        if a.get("steps"):
            md.append(f"\nServed steps of {n} (step log) against the profile with its served terms: {a['steps']} steps, "
                      f"median |error| {a['median_abs']:.1%}, p90 {a['p90_abs']:.1%}, median signed {a.get('median_signed', 0):+.1%}.")
    return "\n".join(md) + "\n"


__all__ = ["markdown"]
