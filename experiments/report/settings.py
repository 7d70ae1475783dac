"""What each engine actually ran with, and its memory split the same way for every engine.

Settings come from `EngineInfo.effective`: values the adapter read back from the engine
itself (its info routes, cache-config labels, startup log), each with its source. A cell
that differs from the other engines' is marked **≠**; a difference that breaks a fairness
rule (dtype, a pinned KV budget, prefix caching, speculation, parallelism) is also flagged.

Memory: every byte of the peak in named parts, the same columns for every engine (`EngineInfo.memory`
keys weights, layout_<name> (one column per layout any engine names), kv_allocated, kv_peak_used and
activation_peak (the largest read, at start or after a repeat's last level; a snapshot's
`kv_peak_used_tokens` too), graph_pool, runtime_* (interpreter and libraries: the RSS of the engine's
processes before weights, on CPU)), the process tree's or the device's peak as sampled, and the
residual, unaccounted = peak − the parts. A dash where a part is not exposed: never a guess.
"""
from __future__ import annotations

from typing import Any

from experiments.report.md import mib, table
from experiments.report.summary import Runs

SETTINGS = (("dtype", "dtype"), ("kv_capacity_tokens", "KV capacity (tokens)"), ("kv_blocks", "KV blocks"),
            ("block_size", "block / page size (tokens)"), ("max_num_seqs", "max running sequences"),
            ("max_num_batched_tokens", "max batched tokens"), ("max_model_len", "max model length"),
            ("chunked_prefill", "chunked prefill"), ("prefix_caching", "prefix caching"),
            ("cuda_graphs", "CUDA graphs"), ("compile", "compiled (torch.compile / engine build)"),
            ("speculative", "speculative decoding"), ("tensor_parallel_size", "tensor parallel size"),
            ("pipeline_parallel_size", "pipeline parallel size"), ("data_parallel_size", "data parallel size (replicas)"))
# Settings whose difference breaks a fairness rule, and why.
FAIRNESS = {"dtype": "engines ran in different dtypes", "prefix_caching": "prefix caching differs between engines",
            "speculative": "speculative decoding differs between engines",
            "tensor_parallel_size": "engines ran on different numbers of devices",
            "pipeline_parallel_size": "engines split their layers over different numbers of devices",
            "data_parallel_size": "engines ran different numbers of replicas"}


def _effective(e) -> dict[str, Any]:
    return ((e.manifest.get("info") or {}).get("effective")) or {}


def _show(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v).replace("|", "/")


def differences(runs: Runs) -> dict[str, dict[str, Any]]:
    """setting -> {engine label: value} for every setting on which two engines that report it differ."""
    out = {}
    for key, _ in SETTINGS:
        vals = {e.label: _effective(e).get(key) for e in runs.engines if _effective(e).get(key) is not None}
        if len({_show(v) for v in vals.values()}) > 1:
            out[key] = vals
    return out


def fairness_flags(runs: Runs) -> list[str]:
    diff, out = differences(runs), []
    for key, why in FAIRNESS.items():
        if key in diff:
            out.append(f"- **settings**: {why}: " + ", ".join(f"{k} {_show(v)}" for k, v in diff[key].items()) + ".")
    pinned = any(c[1].get("kv", {}).get("tokens") for c in runs.configs)
    if pinned and "kv_capacity_tokens" in diff:
        out.append("- **settings**: the KV budget is pinned in the config but the engines report different "
                   "capacities: " + ", ".join(f"{k} {_show(v)}" for k, v in diff["kv_capacity_tokens"].items()) +
                   " (block rounding, or an engine that cannot take a budget in tokens).")
    return out


def settings_section(runs: Runs) -> list[str]:
    """The settings table; where each value was read is a numbered footnote per row (one line per
    setting, engines sharing a source named once), and a value the engine does not report (the
    adapter shows what was asked, adapters.common.readback.AS_REQUESTED) is marked † in its cell."""
    from adapters.common.readback import AS_REQUESTED

    engines = [e for e in runs.engines if _effective(e)]
    if not engines:
        return ["No engine in this report read its settings back."]
    diff = differences(runs)
    rows, notes = [], []
    for key, label in SETTINGS:
        eff = [_effective(e) for e in engines]
        srcs = [(x.get("sources") or {}).get(key) for x in eff]
        cells = [_show(x.get(key)) + (" †" if src and src.startswith(AS_REQUESTED) and x.get(key) is not None else "")
                 + (" **≠**" if key in diff and x.get(key) is not None else "") for x, src in zip(eff, srcs)]
        if not any(c != "–" for c in cells):
            continue
        by_source: dict[str, list[str]] = {}
        for e, x, src in zip(engines, eff, srcs):
            if src and x.get(key) is not None:
                by_source.setdefault(src, []).append(e.label)
        if by_source:
            notes.append(f"[{len(notes) + 1}] {label}: " + "; ".join(
                f"{', '.join(who)}: {src}" for src, who in by_source.items()))
            label = f"{label} [{len(notes)}]"
        rows.append([label] + cells)
    lines = ["Read back from each engine (not the options we passed); **≠** marks a value that differs between "
             "engines, † a value the engine does not report (what was asked is shown). Where each row was read: "
             "its footnote below the table.", ""]
    lines += table(["setting"] + [e.label for e in engines], rows)
    lines += ([""] + [f"- {n}" for n in notes]) if notes else []
    cmds = [(e.label, _effective(e).get("launch_command")) for e in engines if _effective(e).get("launch_command")]
    if cmds:
        lines += ["", "Exact launch commands:", ""] + [f"- {k}: `{c}`" for k, c in cmds]
    return lines


def _peak(e) -> tuple[int | None, str]:
    """The engine's peak memory: device when sampled, else process tree RSS."""
    best, where = None, "–"
    for s in e.summary.values():
        mem = s.get("memory") or {}
        for key, label in (("peak_gpu_bytes", "GPU"), ("peak_rss_bytes", "RSS")):
            v = mem.get(key)
            if v is not None and (best is None or v > best):
                best, where = int(v), label
        if mem.get("peak_gpu_bytes") is not None:
            break
    return best, where


def _after(e, key: str) -> int | None:
    """The largest `key` the engine reported: at start (`info.memory`) or after any repeat's last level
    (`memory_after`); a peak read at start only saw the warm-up."""
    vals = [(e.manifest.get("info") or {}).get("memory", {}).get(key)]
    vals += [(r.get("memory_after") or {}).get(key) for r in (e.manifest.get("repeats") or {}).values()]
    vals = [int(v) for v in vals if v is not None]
    return max(vals) if vals else None


def _kv_peak_used(e) -> int | None:
    """The most KV bytes held at once over the run: the engine's own peak read after its last
    level (each repeat's `memory_after`), else the sampled or snapshot peak in tokens. Never the
    figure read at start, which only saw the warm-up."""
    info = e.manifest.get("info") or {}
    per_tok = (info.get("memory") or {}).get("kv_bytes_per_token")
    peaks = [r["memory_after"]["kv_peak_used"] for r in (e.manifest.get("repeats") or {}).values()
             if (r.get("memory_after") or {}).get("kv_peak_used") is not None]
    for s in e.summary.values():
        after = ((s.get("observer") or {}).get("snapshot_after") or {}).get("extra") or {}
        tok = after.get("kv_peak_used_tokens") or (s.get("memory") or {}).get("peak_kv_used_tokens")
        if tok is not None and per_tok:
            peaks.append(int(tok * per_tok))
    return max(peaks) if peaks else None


def _runtime(m: dict[str, Any]) -> int | None:
    """Interpreter and libraries: every `runtime_*` figure the engine's processes gave (the reference
    server: its engine core's `runtime_base` plus its front end's `runtime_front`)."""
    parts = [v for k, v in m.items() if k.startswith("runtime_")]
    return sum(parts) if parts else None


def layout_names(runs: Runs) -> list[str]:
    """Every weight layout any engine reports (`memory["layout_<name>"]`), in order of first appearance."""
    names: list[str] = []
    for e in runs.engines:
        for k in (e.manifest.get("info") or {}).get("memory") or {}:
            if k.startswith("layout_") and k.removeprefix("layout_") not in names:
                names.append(k.removeprefix("layout_"))
    return names


def memory_row(e, layouts: list[str]) -> tuple[list[int | None], int | None, str]:
    """(parts in COLUMNS' order, peak, where the peak was sampled) for one engine; None: not exposed."""
    m = (e.manifest.get("info") or {}).get("memory") or {}
    peak, where = _peak(e)
    # activations: the peak an engine measured, else the scratch it allocated for them at start (llama.cpp's
    # compute buffer, sized for its largest graph)
    act = _after(e, "activation_peak")
    parts = [m.get("weights"), *(m.get("layout_" + n) for n in layouts), m.get("kv_allocated"), _kv_peak_used(e),
             act if act is not None else m.get("compute_buffer"), m.get("graph_pool"),
             _runtime(m) if where == "RSS" else None]
    return parts, peak, where


def memory_section(runs: Runs) -> list[str]:
    layouts = layout_names(runs)
    rows, notes = [], []
    for e in runs.engines:
        parts, peak, where = memory_row(e, layouts)
        # KV peak used lies inside KV allocated: every other part is a separate share of the peak
        held = [v for i, v in enumerate(parts) if i != len(layouts) + 2 and v is not None]
        rest = peak - sum(held) if peak is not None else None
        rows.append([e.label, *(mib(v) for v in parts), mib(rest), f"{mib(peak)} ({where})" if peak is not None else "–"])
        srcs = ((e.manifest.get("info") or {}).get("effective") or {}).get("sources") or {}
        how = [srcs[k] for k in ("memory.runtime_base", "memory.runtime_front") if k in srcs]
        if how and where == "RSS":
            notes.append(f"- {e.label}, interpreter and libraries: " + "; plus ".join(how) + ".")
    per_rank = []
    for e in runs.engines:  # engines that report each rank's (GPU's) share: the reference engine's weights_rank{r}
        m = (e.manifest.get("info") or {}).get("memory") or {}
        ranks = sorted((int(k.removeprefix("weights_rank")), v) for k, v in m.items() if k.startswith("weights_rank"))
        if len(ranks) > 1:
            per_rank.append(f"- {e.label}: weights per rank (device) " + ", ".join(f"rank {r} {mib(v)}" for r, v in ranks)
                            + " MiB (each rank's shard plus the replicated embedding, LM head and norms)")
    tail = ["", "Memory per device, where an engine reports it:", ""] + per_rank if per_rank else []
    head = ["engine", "parameters", *(f"layout: {n}" for n in layouts), "KV allocated", "KV peak used",
            "activations peak", "CUDA graph pool", "interpreter and libraries", "unaccounted (peak − parts)", "peak"]
    return ["The same split for every engine, in MiB, each part as the engine reports it: the parameters as held; "
            "each weight layout the engine keeps beside them, by name; the KV cache allocated and the most of it "
            "in use (inside the allocation, not added); the activations' peak (CUDA: a profile forward at start; "
            "the reference engine on CPU: its process's RSS high-water since start-up above its RSS then, read "
            "after the run: activations, whose heap stays resident, plus kernel caches and request state; "
            "llama.cpp: the compute buffer it allocates for them at start, from its log); the "
            "CUDA graph pool; the interpreter and libraries (CPU only: RSS before any weight, see below); then "
            "the peak as sampled (GPU memory where there is a GPU, else the RSS of the engine's process tree) "
            "and what the parts leave of it, unaccounted (a part shown as a dash is inside it; on CPU also "
            "freed memory the allocator keeps and pages shared between a process and its forked child, "
            "which the tree's RSS counts twice). A dash where an engine does not expose a part.", ""] + \
        table(head, rows) + ([""] + notes if notes else []) + tail
