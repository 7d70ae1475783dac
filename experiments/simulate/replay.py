"""`inferlab simulate CONFIG`: the config's workload and load, replayed in simulated time.

The harness's own runner (`experiments.running.runner.run_engine`: warm-up, levels or the SLO search, the
load generator, requests.jsonl, manifest) drives a `SimulatedEngine` on `experiments.running.clock.simulated()`,
so a simulated run folder is a run folder: `inferlab report` renders it, and merged with a measured
run of the same config the report adds "predicted vs measured" (experiments/report/predicted.py).
The folder is `<out>/<name>-simulated/<engine>-simulated/`: nothing in it can pass for a measurement.

The replica is built from what the engine would run with: the config's engine options that the
reference engine's `EngineConfig` takes, the pinned KV budget, `max_model_len` as the run chooses it;
or, with `settings` (another engine's settings read back from a measured run's manifest: vLLM's block
size, token budget, max sequences, KV capacity), those.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.running import clock, search
from experiments.simulate import gpu
from experiments.simulate.replica import Replica
from experiments.simulate.served import SimulatedEngine
from experiments.simulate.step_model import ModelShape, Profile
from experiments.simulate.sweep import engine_config
from experiments.workload import context, workloads

SETTINGS = ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len")


def read_settings(run_dir: str | Path, engine: str) -> dict[str, Any]:
    """An engine's settings as read back in a measured run (manifest info.effective), or a JSON file
    holding them under "settings" (a step timer's output, adapters/engines/vllm/step_sweep.py: read back from the engine it timed)."""
    if Path(run_dir).is_file():
        return {k: v for k, v in json.loads(Path(run_dir).read_text())["settings"].items()
                if k in SETTINGS or k in ("enable_chunked_prefill", "enable_prefix_caching", "kv_cache_tokens")}
    m = json.loads((Path(run_dir) / engine / "manifest.json").read_text())
    eff = (m.get("info") or {}).get("effective") or {}
    out = {k: eff[k] for k in SETTINGS if eff.get(k) is not None}
    if eff.get("kv_capacity_tokens"):
        out["kv_cache_tokens"] = int(eff["kv_capacity_tokens"])
    if eff.get("prefix_caching") is not None:
        out["enable_prefix_caching"] = bool(eff["prefix_caching"])
    if eff.get("chunked_prefill") is not None:
        out["enable_chunked_prefill"] = bool(eff["chunked_prefill"])
    return out


def replica_for(cfg, engine: str, profile: Profile, max_model_len: int | None, accept: float = 0.7,
                settings: dict[str, Any] | None = None, seed: int = 0) -> Replica:
    """The replica the config's engine would be: its scheduler settings, KV blocks and speculation."""
    opts = dict(cfg.engine_options.get(engine, {}))
    if cfg.kv.tokens is not None and not profile.memory_gb:  # a GPU profile sizes its own cache (gpu.size): the
        opts.setdefault("kv_cache_tokens", cfg.kv.tokens)     # config's pin was chosen for the machine it measures on
    if max_model_len is not None:
        opts.setdefault("max_model_len", max_model_len)
    opts.update(settings or {})
    spec = opts.pop("speculative_config", None)
    ecfg = engine_config(cfg.model, cfg.dtype, opts)
    shape = ModelShape.from_dir(cfg.model, cfg.dtype)
    tensor = cfg.parallel.tensor if cfg.parallel else 1
    if ecfg.kv_cache_tokens:
        tokens = ecfg.kv_cache_tokens
    elif profile.memory_gb:  # a GPU profile: what its memory holds after the weights and activations (gpu.size)
        tokens = gpu.size(profile, shape, tensor, opts.get("gpu_memory_utilization"), ecfg.max_num_batched_tokens,
                          ecfg.max_num_seqs).kv_tokens
    else:
        tokens = min((1 << 30) // int(shape.kv_bytes_per_token), ecfg.max_num_seqs * (ecfg.max_model_len or 4096))
    k = int(spec.get("num_speculative_tokens", 0)) if spec else 0
    lookahead = k if spec and (spec.get("method") == "draft_model" or spec.get("model")) else 0
    served = opts.get("mode") == "server" or settings is not None  # behind HTTP: the served overhead applies
    return Replica(ecfg, tokens // ecfg.block_size, shape, profile, spec_k=k, accept=accept if k else 0.0,
                   lookahead=lookahead, seed=seed, served=served, tensor=tensor)


def replay(cfg, toml: str, profile: Profile, out: Path, lengths: dict[str, int] | None = None,
           accept: float = 0.7, settings: dict[str, Any] | None = None, engines: list[str] | None = None) -> Path:
    """Run the config's engines (or `engines`) in simulated time into `<out>/<name>-simulated/`; returns
    the folder."""
    from experiments.report import build
    from experiments.running.runner import Plan, run_engine

    items, warm = workloads.build(cfg.model, cfg.workload, cfg.load.warmup)
    max_model_len = context.choose(cfg, search.sized(cfg, items) + warm, workloads.context_len(cfg.model))
    run_dir = out / f"{cfg.name}-simulated"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(toml)
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    (run_dir / "workload.json").write_text(json.dumps(workloads.describe(items, cfg.workload), indent=2))
    plan = Plan(cfg, run_dir, items, warm, {"note": "simulated: no bandwidth measured"})
    with clock.simulated():
        for name in engines or cfg.engine_list():
            rep = replica_for(cfg, name, profile, max_model_len, accept, settings)
            label = f"{name}-simulated"
            eng = SimulatedEngine(rep, label, lengths, {"simulated_engine": name, "profile": profile.label})
            run_engine(plan, label, eng, {"profile": profile.label, "accept": accept}, cfg.kv.tokens is not None)
            mark(run_dir / label / "manifest.json", profile, name, lengths, eng.unknown_lengths)
    build([run_dir], run_dir)
    return run_dir


def mark(path: Path, profile: Profile, engine: str, lengths: dict[str, int] | None, unknown: int = 0) -> None:
    """Say in the manifest what was simulated with what (the report reads `simulated`)."""
    m = json.loads(path.read_text())
    given = "given per request" + (f", except {unknown} requests that ran to max_tokens (no length given)"
                                   if unknown else "")
    m["simulated"] = {"engine": engine, "profile": profile.label, "calibrated": profile.calibrated,
                      "profile_machine": profile.machine, "profile_date": profile.date,
                      "anchored": profile.anchored or None,
                      "eos_lengths": given if lengths else "none: every answer runs to max_tokens"}
    # a frontier's "per device": the profile's device (a GPU spec sheet), else this machine's cores it was fitted on
    tp = ((m.get("info") or {}).get("effective") or {}).get("tensor_parallel_size") or 1
    m["devices"] = ({"kind": "gpu", "count": tp, "per": f"per GPU (the profile's {profile.name})", "model": profile.name}
                    if profile.memory_gb else {**(m.get("devices") or {}), "per": f"per core (the profile's machine, "
                                                                               f"{profile.machine or '?'})"})
    path.write_text(json.dumps(m, indent=2, default=str))
