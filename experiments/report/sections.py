"""The report's prose sections: where the numbers came from, the engines as they ran,
the flags, and the greedy-token agreement."""
from __future__ import annotations

from adapters import registry
from adapters.common import parallel
from experiments.report import observer
from experiments.report.md import fmt, table
from experiments.report.summary import Runs, agreement


def provenance(runs: Runs) -> list[str]:
    """The commands that produced the runs, and the machine they ran on (from the manifests)."""
    lines, seen = [], set()
    for e in runs.engines:
        m = e.manifest
        cmd, hw = m.get("command"), m.get("hardware") or {}
        if cmd and cmd not in seen:
            seen.add(cmd)
            lines.append(f"- command: `{cmd}` (started {m.get('started_at', '?')}, git {str(m.get('git_commit'))[:10]})")
        machine = f"{hw.get('cpu', '?')}, {hw.get('cores_logical', '?')} logical cores, " \
                  f"{(hw.get('ram_bytes') or 0) / 2**30:.0f} GiB RAM, GPUs: {', '.join(hw.get('gpus') or []) or 'none'}"
        if machine not in seen:
            seen.add(machine)
            lines.append(f"- machine: {machine}")
    return lines


def engines(runs: Runs) -> list[str]:
    rows = []
    for e in runs.engines:
        m, info = e.manifest, e.manifest.get("info") or {}
        mode = info.get("mode", "–") + (" (same interpreter)" if m.get("same_process") else "")
        spec = registry.spec(e.name)
        label = e.label + (" (naive baseline)" if spec is not None and spec.baseline else "")
        per_engine, per_replica = parallel.gpus(info.get("effective") or {})
        devices = "–" if per_engine is None else f"{per_engine} / {per_replica}"
        rows.append([label, m.get("status", "–"), mode, info.get("version", "–"), info.get("dtype", "–"), devices,
                     fmt(info.get("kv_capacity_tokens")), fmt(m.get("kv_pinned")), _runs(m),
                     (m.get("reason") or "").replace("|", "/").replace("\n", " ")[:300]])
    return table(["engine", "status", "mode", "version", "dtype", "devices (engine / replica)",
                  "KV capacity (tokens)", "KV pinned", "repeats (sessions)", "reason"], rows) + [
        "", "Devices: tensor x pipeline x data-parallel sizes as each engine reports them (per replica: tensor x "
        "pipeline); on CPU a \"device\" is one process's share of the cores."]


def _runs(m: dict) -> str:
    reps = m.get("repeats") or {}
    if not reps:  # a run folder from before repeats existed
        return fmt(m.get("sessions"))
    return f"{len(reps)} ({sum(r.get('sessions', 0) for r in reps.values())})"


def flags(runs: Runs) -> list[str]:
    out = []
    for e in runs.engines:
        if e.manifest.get("same_process"):
            out.append(f"- **{e.label}** ran inside the harness's interpreter: its latency numbers are perturbed "
                       "by the client (in-process mode is for offline throughput only).")
        if (e.manifest.get("info") or {}).get("mode") == "attach":
            out.append(f"- **{e.label}** was attached to a server started elsewhere: its process memory is not "
                       "measured here and its KV budget was set by whoever started it.")
        elif e.manifest.get("kv_pinned") is False and any(c[1].get("kv", {}).get("tokens") for c in runs.configs):
            out.append(f"- **{e.label}** does not take a pinned KV budget in tokens; see its KV capacity above.")
        if (e.manifest.get("scheduler") or {}).get("warning"):
            out.append(f"- **{e.label}**: {e.manifest['scheduler']['warning']}.")
        for setting, why in ((e.manifest.get("info") or {}).get("unhonoured") or {}).items():
            out.append(f"- **{e.label}** could not honour `{setting}`: {why}.")
        sampling = _config(runs, e).get("sampling") or {}
        effective = (e.manifest.get("info") or {}).get("effective") or {}
        if sampling.get("seed") is not None and sampling.get("temperature", 0) > 0 and \
                effective.get("seeded_sampling") is False:
            out.append(f"- **{e.label}** ignored the sampling seed ({effective['sources']['seeded_sampling']}): its "
                       "sampled tokens are not reproducible and differ from the other engines' by chance.")
        for level, s in e.summary.items():
            c = s["token_checks"]
            ran_to_length = (_config(runs, e).get("sampling") or {}).get("ignore_eos", True)
            if c["stopped_early"] and ran_to_length:  # without ignore_eos, ending at EOS is the point
                why = ("TGI has no `ignore_eos`" if (e.manifest.get("info") or {}).get("knobs", {}).get("ignore_eos")
                       == "unsupported" else "the engine did not honour `ignore_eos`")
                out.append(f"- **{e.label}** {level}: {c['stopped_early']} request(s) stopped before max_tokens "
                           f"({why}); its throughput counts fewer tokens.")
            if c["reported_count_mismatch"] or c["prompt_count_mismatch"]:
                out.append(f"- **{e.label}** {level}: token counts reported by the engine differ from the ids "
                           f"({c['reported_count_mismatch']} output, {c['prompt_count_mismatch']} prompt).")
            if s["harness"].get("warning") and not e.manifest.get("same_process"):
                out.append(f"- **{e.label}** {level}: {s['harness']['warning']}.")
            out += observer.flags(e, level, s)
    return out


def _config(runs: Runs, e) -> dict:
    return next((c for d, c, _ in runs.configs if d == e.run_dir), {})


def agreement_section(runs: Runs) -> list[str]:
    base = runs.baseline
    agr = agreement(runs)
    if base is None or not agr:
        return ["Only one engine finished requests; nothing to compare."]
    rows = [[label, lv, fmt(a["requests"]), fmt(a["exact"], 3), fmt(a["prefix"], 3)]
            for label, levels in agr.items() for lv, a in levels.items()]
    return [f"Against **{base.label}**, over the requests both finished (greedy sampling should agree; "
            "small numeric differences can flip a near-tie and everything after it):", ""] + \
        table(["engine", "level", "requests", "identical outputs", "mean matching prefix"], rows)
