"""Where a served request's TTFT goes, from a harness run's requests.jsonl and the server's step log
(`inferlab serve --step-log`, reference_engine/engine/step_log.py): both on the machine's monotonic clock.

    .venv/bin/python scripts/ttft_parts.py RUN/reference/requests.jsonl STEPS.jsonl [--simulated SIM/requests.jsonl]

Per level, medians over the requests matched to the core's admissions (ms):
  to core   the client's send -> the core queued it (front end: HTTP, tokenize, hand-off between steps)
  queued    queued -> the step that admitted it began (waiting for a step to end, then for room)
  prefill   that step's start -> the end of the step that made its first token
  delivery  that step's end -> the client read the first token (output path, SSE)
With --simulated, the simulator's TTFT for the same requests beside the measured one.
Matching: each client request to the first unmatched admission, after its send, of a request with its
prompt length (tokens scheduled + prefix hits): prompts are short here, so never chunked.
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

from reference_engine.engine.step_log import read


def admissions(steps_path: str) -> list[dict]:
    """Every first admission in the log: arrival, admit step start, first-token step end, prompt length."""
    adm: dict[str, dict] = {}
    for steps in read(steps_path).values():
        for s in steps:
            sched = {rid: n for rid, n, _ in s.scheduled}
            for rid, at in getattr(s, "arrived", {}).items():
                if rid not in adm:
                    adm[rid] = {"arrived": at, "admitted": s.t0, "prompt": sched[rid] + s.prefix_hits.get(rid, 0)}
            for rid in s.new_tokens:
                if rid in adm and "first" not in adm[rid]:
                    adm[rid]["first"] = s.t0 + s.duration_s
    return sorted((a for a in adm.values() if "first" in a), key=lambda a: a["arrived"])


def match(records: list[dict], adm: list[dict]) -> list[tuple[dict, dict]]:
    free, pairs = list(adm), []
    for r in sorted(records, key=lambda r: r["send_ns"]):
        send, n = r["send_ns"] / 1e9, len(r["prompt_token_ids"])
        a = next((a for a in free if a["arrived"] >= send and a["prompt"] == n), None)
        if a is not None:
            free.remove(a)
            pairs.append((r, a))
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("requests")
    ap.add_argument("steps")
    ap.add_argument("--simulated", default=None)
    a = ap.parse_args()
    recs = [r for r in map(json.loads, open(a.requests)) if r.get("events")]
    sim = {}
    if a.simulated:
        for r in map(json.loads, open(a.simulated)):
            if r.get("events"):
                sim[(r["level"], r["request_id"])] = (r["events"][0][0] - r["send_ns"]) / 1e6
    parts = defaultdict(lambda: defaultdict(list))
    pairs = match(recs, admissions(a.steps))
    for r, adm in pairs:
        send, first = r["send_ns"] / 1e9, r["events"][0][0] / 1e9
        p = parts[r["level"]]
        p["to core"].append(adm["arrived"] - send)
        p["queued"].append(adm["admitted"] - adm["arrived"])
        p["prefill"].append(adm["first"] - adm["admitted"])
        p["delivery"].append(first - adm["first"])
        p["TTFT"].append(first - send)
        if (r["level"], r["request_id"]) in sim:
            p["simulated TTFT"].append(sim[(r["level"], r["request_id"])] / 1e3)
    print(f"{len(pairs)} of {len(recs)} requests matched to the core's admissions\n")
    cols = ["to core", "queued", "prefill", "delivery", "TTFT"] + (["simulated TTFT"] if sim else [])
    print("| level | n | " + " | ".join(cols) + " |\n|---|---|" + "---|" * len(cols))
    for level, p in parts.items():
        print(f"| {level} | {len(p['TTFT'])} | " + " | ".join(f"{statistics.median(p[c]) * 1e3:.1f}" for c in cols) + " |")


if __name__ == "__main__":
    main()
