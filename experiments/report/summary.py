"""Turns run folders into per-engine, per-level summaries (written as summary.json).

Invariants: everything here is recomputed from requests.jsonl + manifest.json, so a
report can be rebuilt or merged at any time; nothing depends on the process that ran.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from adapters import registry
from adapters.base import UNKNOWN_TOKEN_ID
from experiments.measuring import bandwidth, ceilings, intervals, metrics, observer, saturation, tp_share, wire
from experiments.running.results import EngineDir

CPU_SHARE_WARN = 0.10  # of one core: above this the client may perturb an engine on a small machine


@dataclass
class EngineResult:
    label: str
    name: str
    run_dir: Path
    manifest: dict[str, Any]
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # level -> records
    summary: dict[str, dict[str, Any]] = field(default_factory=dict)  # level -> metrics


@dataclass
class Runs:
    configs: list[tuple[Path, dict[str, Any], str]]  # (run dir, config.json, config.toml text)
    engines: list[EngineResult]
    levels: list[str]

    @property
    def baseline(self) -> EngineResult | None:
        ok = [e for e in self.engines if e.records]
        return next((e for e in ok if (s := registry.spec(e.name)) is not None and s.anchor), ok[0] if ok else None)


def load_runs(dirs: list[Path]) -> Runs:
    configs, engines, levels = [], [], []
    for d in dirs:
        cfg = json.loads((d / "config.json").read_text())
        toml = (d / "config.toml").read_text() if (d / "config.toml").is_file() else ""
        configs.append((d, cfg, toml))
        order = [e for e in (cfg.get("engine"),) if e] or list(cfg.get("engines") or [])
        order += [e for e in cfg.get("optional_engines", []) if e not in order]
        present = sorted(p.name for p in d.iterdir() if (p / "manifest.json").is_file())
        for name in [e for e in order if e in present] + [e for e in present if e not in order]:
            ed = EngineDir(d, name)
            res = EngineResult(name, name, d, ed.read("manifest.json") or {})
            for r in ed.records():
                res.records.setdefault(r["level"], []).append(r)
                if r["level"] not in levels:
                    levels.append(r["level"])
            engines.append(res)
    names = [e.name for e in engines]
    for e in engines:
        if names.count(e.name) > 1:
            e.label = f"{e.name}@{e.run_dir.name}"
    return Runs(configs, engines, _sort_levels(levels))


def _sort_levels(levels: list[str]) -> list[str]:
    def key(lv: str) -> tuple[str, float]:
        kind, _, v = lv.partition("=")
        return kind, float(v)

    return sorted(levels, key=key)


def _retokenizer(model: str):
    try:
        from experiments.workload.workloads import load_tokenizer

        tok = load_tokenizer(model)
    except Exception:  # model folder gone or unreadable: skip the cross-check
        return None
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def _has_unknown(rec: dict[str, Any]) -> bool:
    return UNKNOWN_TOKEN_ID in rec["output_token_ids"]


def summarize(runs: Runs) -> None:
    """Fill every EngineResult.summary and write it to the engine's summary.json. An engine folder without
    raw records (requests.jsonl stays out of git: a fresh clone, or another cell of a matrix rerun alone)
    keeps the summary.json it has, so rebuilding a page never erases a result it cannot recompute."""
    shapes: dict[tuple[str, str], dict[str, Any] | None] = {}
    retok: dict[str, Any] = {}
    for e in runs.engines:
        cfg = next(c for d, c, _ in runs.configs if d == e.run_dir)
        model, dtype = cfg["model"], cfg["dtype"]
        if model not in retok:
            retok[model] = _retokenizer(model)
        if (model, dtype) not in shapes:
            try:
                shapes[(model, dtype)] = bandwidth.model_shape(model, dtype)
            except (OSError, ValueError, KeyError):
                shapes[(model, dtype)] = None
        if not e.records and (kept := EngineDir(e.run_dir, e.name).read("summary.json")) and kept.get("levels"):
            e.summary = kept["levels"]
            runs.levels[:] = _sort_levels(list(dict.fromkeys([*runs.levels, *e.summary])))
            continue
        for level, recs in e.records.items():
            by_rep: dict[int, list[dict[str, Any]]] = {}
            for r in recs:
                by_rep.setdefault(r.get("repeat", 1), []).append(r)
            per = {r: _one(e, level, r, rr, cfg, shapes[(model, dtype)], retok[model])
                   for r, rr in sorted(by_rep.items())}
            if len(per) == 1:  # one run: intervals over its requests (latency), a sustained level's over its windows
                s = next(iter(per.values()))
                s["ci"], s["ci_basis"] = _request_ci(recs), "requests"
                if (w := intervals.mean_ci(s.get("throughput_windows") or [])) is not None:
                    s["ci"]["output_throughput"], s["throughput_ci_basis"] = [w[1], w[2]], "windows"
            else:  # medians over the repeats, intervals over the repeats
                ci: dict[str, list[float]] = {}
                s = intervals.merge(list(per.values()), ci)
                s["ci"], s["ci_basis"], s["throughput_ci_basis"] = ci, "repeats", "repeats"
                s["per_repeat"] = {str(r): v for r, v in per.items()}
            s["repeats"] = sorted(per)
            e.summary[level] = s
        EngineDir(e.run_dir, e.name).write("summary.json", {"engine": e.name, "status": e.manifest.get("status"),
                                                            "levels": e.summary})


def _one(e: EngineResult, level: str, repeat: int, recs: list[dict[str, Any]], cfg: dict[str, Any],
         shape: dict[str, Any] | None, retok: Any) -> dict[str, Any]:
    """The metrics of one repeat of one level."""
    known = [r for r in recs if not _has_unknown(r)]
    # placeholder ids (text-only engines) make a re-tokenized count meaningless
    s = metrics.summarize(recs, cfg.get("slo") or {}, retok if len(known) == len(recs) else None)
    lv_all = e.manifest.get("levels", {}).get(level, {})
    lv = lv_all.get(str(repeat)) or (lv_all if "memory" in lv_all else {})  # (runs before repeats existed)
    s["memory"] = lv.get("memory", {})
    s["harness"] = _harness(lv, e.manifest)
    _observed(s, lv, recs)
    s["bandwidth"] = _bandwidth(_own_weights(shape, e.manifest.get("info") or {}, cfg["dtype"]), s, level, recs)
    try:
        params = ceilings.non_embedding_params(cfg["model"])
    except (OSError, KeyError, ValueError):
        params = None
    s["ceilings"] = ceilings.fractions(s, params, e.manifest.get("compute_peak") or {},
                                       e.manifest.get("peak_bandwidth") or {})
    info, copy = e.manifest.get("info") or {}, e.manifest.get("peak_bandwidth") or {}
    link = copy.get("gpu_gbps") if (info.get("effective") or {}).get("device", "").startswith("cuda") else copy.get("cpu_gbps")
    s["parallel"] = tp_share.summary(s, info.get("effective") or {}, s.get("engine_counters") or {}, link)
    cost = cfg.get("cost_per_hour")
    if cost and s.get("output_throughput"):  # the machine's price per hour over tokens per hour
        s["cost_per_m_output"] = cost / (s["output_throughput"] * 3600) * 1e6
    s["client_lateness_ms"] = metrics.stats(metrics.lateness_ms(recs))
    s["saturation"] = saturation.pressure(s["server_view"], s["observer"], s)
    s["energy"] = lv.get("energy") or {}
    if s["energy"].get("joules") is not None and s.get("output_tokens"):
        s["joules_per_output_token"] = s["energy"]["joules"] / s["output_tokens"]
    if (cfg.get("load") or {}).get("mode") == "sweep":  # a sustained level: the spread of its windows
        s["throughput_windows"] = metrics.window_throughputs(recs)
    return s


LATENCY = ("ttft_ms", "tpot_ms", "e2el_ms", "itl_ms")
STATS = {"mean": np.mean, "median": np.median, "p90": lambda a, **k: np.percentile(a, 90, **k),
         "p99": lambda a, **k: np.percentile(a, 99, **k)}


def _request_ci(recs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """95 % intervals of the latency statistics of one run, resampling its requests."""
    rows = [metrics.per_request(r) for r in recs]
    out: dict[str, list[float]] = {}
    rng = np.random.default_rng(intervals.SEED)
    for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
        a = np.asarray([r[key] for r in rows], dtype=float)
        a = a[a == a]
        if a.size < 2:
            continue
        boot = a[rng.integers(0, a.size, size=(intervals.B, a.size))]  # (B, n): one resample per row
        for name, fn in STATS.items():
            lo, hi = np.percentile(fn(boot, axis=1), [2.5, 97.5])
            out[f"{key}.{name}"] = [float(lo), float(hi)]
    itl = [np.asarray(r["itl_ms"], dtype=float) for r in rows]
    for name, fn in STATS.items():
        ci = intervals.request_ci(itl, fn, b=200)
        if ci:
            out[f"itl_ms.{name}"] = list(ci)
    return out


def _harness(lv: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    wall, cpu, sent = lv.get("wall_s"), lv.get("harness_cpu_s"), lv.get("sent")
    share = cpu / wall if wall else None
    same = manifest.get("same_process", False)
    warn = None
    if same:
        warn = "engine ran inside the harness's interpreter: latency is perturbed and the CPU figure includes the engine"
    elif share is not None and share > CPU_SHARE_WARN:
        warn = f"the harness used {share:.0%} of a core; on a small machine that can slow the engine it measures"
    tree = lv.get("engine_cpu") or []  # the engine's processes (runner.engine_cpu); none for an attached server
    same = same or any(d.get("harness") for d in tree)  # an in-process engine's time is the harness's

    def cores(procs: list[dict[str, Any]]) -> float | None:
        return sum(d["cpu_s"] for d in procs) / wall if procs and wall else None

    return {"cpu_s": cpu, "wall_s": wall, "core_share": share,
            "cpu_ms_per_request": cpu / sent * 1e3 if cpu is not None and sent else None, "warning": warn,
            "engine_cores": None if same else cores(tree),
            "front_end_cores": None if same else cores([d for d in tree if d["root"]]),
            "engine_processes": len(tree) or None}


def _observed(s: dict[str, Any], lv: dict[str, Any], recs: list[dict[str, Any]]) -> None:
    """The server's own view beside the client's, and readings that cannot be the engine's."""
    view = lv.get("server_view")
    cmp = observer.compare(s, view)
    own_itl = (cmp or {}).get("rows", {}).get("itl", {}).get("server_ms")
    obs = lv.get("observer") or {}
    bunch = observer.bunched(recs, own_itl or s["itl_ms"]["mean"], obs.get("loop"))  # means are robust to bunching
    s["server_view"] = view
    s["client_vs_server"] = cmp
    s["bunched"] = bunch
    s["wire"] = wire.split(recs)
    s["implausible"] = observer.implausible(s, cmp, bunch)
    s["observer"] = lv.get("observer") or {}
    s["mean_in_flight"] = metrics.mean_decoding(recs)
    s["engine_counters"] = _counters(view, s["observer"])


# Counter names as an adapter's snapshot().extra carries them (engines without Prometheus metrics)
EXTRA = {"prefix_queries": "prefix_cache_queries", "prefix_hits": "prefix_cache_hits",
         "spec_drafts": "spec_decode_num_drafts", "spec_draft_tokens": "spec_decode_num_draft_tokens",
         "spec_accepted_tokens": "spec_decode_num_accepted_tokens",
         **{k: k for k in ("tp_decode_steps", "tp_decode_seconds", "tp_decode_allreduce_seconds",
                           "tp_decode_allreduce_bytes")}}


def _counters(view: dict[str, Any] | None, obs: dict[str, Any]) -> dict[str, Any]:
    """The engine's own prefix-cache and speculation counters over the level, and their rates:
    from its Prometheus counters, else from the adapter's snapshots around the level."""
    c = dict((view or {}).get("counters") or {})
    before = ((obs.get("snapshot_before") or {}).get("extra")) or {}
    after = ((obs.get("snapshot_after") or {}).get("extra")) or {}
    for key, name in EXTRA.items():
        if key not in c and name in after and name in before:
            c[key] = after[name] - before[name]
    out = {k: c[k] for k in EXTRA if k in c}
    if c.get("prefix_queries"):
        out["prefix_hit_rate"] = c.get("prefix_hits", 0) / c["prefix_queries"]
    if c.get("spec_draft_tokens"):
        out["spec_acceptance_rate"] = c.get("spec_accepted_tokens", 0) / c["spec_draft_tokens"]
    if c.get("spec_drafts"):
        out["spec_mean_accepted"] = c.get("spec_accepted_tokens", 0) / c["spec_drafts"]
    return out


def _own_weights(shape: dict[str, Any] | None, info: dict[str, Any], dtype: str) -> dict[str, Any] | None:
    """The model's shape with the engine's own weight bytes where it runs another weight format than the
    config's dtype (a quantized GGUF served as shipped): what its decode step reads is its own bytes."""
    own = (info.get("memory") or {}).get("weights")
    if shape is None or not own or info.get("dtype") in (None, dtype):
        return shape
    return {**shape, "weight_bytes": int(own)}


def _bandwidth(shape: dict[str, Any] | None, s: dict[str, Any], level: str, recs: list[dict[str, Any]]) -> dict:
    if shape is None:
        return {}
    running = s["memory"].get("mean_num_running")  # the engine's own count, when a timeline ran
    if not running:  # else the client's: requests between their first and last token, time-averaged
        running = s.get("mean_in_flight")
    ctx = s["prompt_tokens"] / len(recs) + s["output_tokens"] / len(recs) / 2
    return {**bandwidth.decode_estimate(shape, s["tpot_ms"]["median"], running, ctx),
            "weight_bytes": shape["weight_bytes"], "kv_bytes_per_token": shape["kv_bytes_per_token"]}


def agreement(runs: Runs) -> dict[str, dict[str, dict[str, Any]]]:
    """label -> level -> greedy-token agreement against the baseline engine."""
    base = runs.baseline
    out: dict[str, dict[str, dict[str, Any]]] = {}
    if base is None:
        return out
    for e in runs.engines:
        if e is base or not e.records:
            continue
        for level in runs.levels:
            a = {r["request_id"]: r["output_token_ids"] for r in base.records.get(level, []) if not _has_unknown(r)}
            b = {r["request_id"]: r["output_token_ids"] for r in e.records.get(level, []) if not _has_unknown(r)}
            out.setdefault(e.label, {})[level] = metrics.agreement(a, b)
    return out


def same_prompts(runs: Runs) -> bool | None:
    """True when every engine got the identical prompt token ids for every common request."""
    seen: dict[tuple[str, str], list[int]] = {}
    for e in runs.engines:
        for level, recs in e.records.items():
            for r in recs:
                k = (level, r["request_id"])
                if seen.setdefault(k, r["prompt_token_ids"]) != r["prompt_token_ids"]:
                    return False
    return True if seen else None
