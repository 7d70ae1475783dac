"""Runs in .venv-sglang (scripts/setup_sglang_venv.sh), not under pytest: checks what the
SGLang adapter sends and relies on against SGLang's own code. Reads a JSON request on stdin
(argv lists, sampling params, /generate bodies, OpenAI completion bodies), writes a JSON
report on stdout; tests/adapters/test_sglang_contract.py asserts on it.

Imported and run (on CPU): the argument parser of `sglang.srt.server_args`, the msgspec
`SamplingParams` (construct, normalize, verify), the pydantic `CompletionRequest` of
`sglang.srt.entrypoints.openai.protocol`. Read from the installed source without importing
(their modules pull CUDA-only code): the fields of `GenerateReqInput` and
`FlushCacheReqOutput` (managers/io_struct.py), the Prometheus names in
observability/metrics_collector.py, what `Engine.get_server_info` / `Engine.flush_cache`
call (entrypoints/engine.py), the scheduler-info keys (managers/scheduler.py), and how
`--max-total-tokens` bounds the KV pool (mem_cache/kv_cache_configurator.py); for the settings
read back, the ServerArgs record fields (what /server_info returns), the internal-state and
memory-usage keys, the speculative algorithms and how NGRAM / STANDALONE count draft tokens.

Triton (a GPU compiler, not installed) is replaced by SGLang's own import stub
(adapters/engines/sglang/upstream_check.py, whose helpers this script shares).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import json
import re
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

# the helpers the dry run uses too, loaded by path: the engine folder's package imports the adapter (httpx, ...),
# which this venv of SGLang's own code does not have
_CHECK = Path(__file__).resolve().parents[2] / "adapters" / "engines" / "sglang" / "upstream_check.py"
_spec = importlib.util.spec_from_file_location("sglang_upstream_check", _CHECK)
upstream_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(upstream_check)
ByteTokenizer, class_fields, parse_argv, stub_triton = (upstream_check.ByteTokenizer, upstream_check.class_fields,
                                                         upstream_check.parse_argv, upstream_check.stub_triton)

PKG = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])


def method_calls(path: Path, cls: str, method: str) -> list[str]:
    """Dotted names of the calls in `cls.method`, e.g. "self.loop.run_until_complete"."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == method:
                    return sorted({ast.unparse(c.func) for c in ast.walk(f) if isinstance(c, ast.Call)})
    return []


def main() -> dict[str, Any]:
    req = json.load(sys.stdin)
    stub_triton()
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    report: dict[str, Any] = {"version": version("sglang")}
    report["argv"] = [parse_argv(parser, a, req["namespace_keys"]) for a in req["argvs"]]
    report["dtype_choices"] = next(list(a.choices) for a in parser._actions if "--dtype" in a.option_strings)

    sampling = []
    for sp in req["sampling_params"]:
        try:
            p = SamplingParams(**sp)
            p.normalize(ByteTokenizer())
            p.verify(req["vocab_size"])
            sampling.append({"ok": True})
        except Exception as e:  # noqa: BLE001 - reported, asserted by the test
            sampling.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    report["sampling"] = sampling

    completion = []
    for body in req["completion_bodies"]:
        try:
            r = CompletionRequest.model_validate(body)
            completion.append({"ok": True, "set": sorted(r.model_fields_set),
                               "extra": sorted((r.model_extra or {}).keys())})
        except Exception as e:  # noqa: BLE001
            completion.append({"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]})
    report["completion"] = completion

    srt = PKG / "srt"
    report["generate_fields"] = class_fields(srt / "managers/io_struct.py", "GenerateReqInput")
    report["flush_output_fields"] = class_fields(srt / "managers/io_struct.py", "FlushCacheReqOutput")
    report["metric_names"] = sorted(set(re.findall(r'name="(sglang:[a-zA-Z0-9_:]+)"',
                                                   (srt / "observability/metrics_collector.py").read_text())))
    report["engine_calls"] = {m: method_calls(srt / "entrypoints/engine.py", "Engine", m)
                              for m in ("get_server_info", "flush_cache", "_ensure_event_loop")}
    report["scheduler_info_has_max_total_num_tokens"] = '"max_total_num_tokens":' in (srt / "managers/scheduler.py").read_text()
    report["max_total_tokens_is_an_upper_bound"] = "min(capacity, max_total_tokens)" in (
        srt / "mem_cache/kv_cache_configurator.py").read_text()
    report.update(readback_facts(srt))
    return report


def enum_members(path: Path, cls: str) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return [t.id for s in node.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)]
    return []


def returned_keys(path: Path, func: str) -> list[str]:
    """String keys of the dict literal `func` returns."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == func:
            for r in ast.walk(node):
                if isinstance(r, ast.Return) and isinstance(r.value, ast.Dict):
                    return [k.value for k in r.value.keys if isinstance(k, ast.Constant)]
    return []


def readback_facts(srt: Path) -> dict[str, Any]:
    """What the adapter's /server_info read-back and feature flags rely on: /server_info is
    `server_args.resolved_dict()` (one key per ServerArgs record field) plus the scheduler info and
    `internal_states`; the speculative algorithms; how NGRAM and STANDALONE count draft tokens."""
    from sglang.srt import server_args as sa

    hook = (srt / "arg_groups/speculative_hook.py").read_text()
    reporter = (srt / "managers/scheduler_components/metrics_reporter.py").read_text()
    common = (srt / "utils/common.py").read_text()
    return {
        "server_info_fields": sorted(f.name for f in sa.record_fields(sa.ServerArgs)),
        "server_info_is_resolved_dict": "result = server_args.resolved_dict()" in common,
        "internal_state_has_max_running": 'state["effective_max_running_requests_per_dp"]' in (
            srt / "managers/scheduler_components/internal_state.py").read_text(),
        "memory_usage_keys": returned_keys(srt / "managers/scheduler_components/memory_usage.py", "build_memory_usage"),
        "memory_usage_in_gib": "return free_gpu_memory / (1 << 30)" in common
        and "GB = 1024 * 1024 * 1024" in (srt / "mem_cache/memory_pool.py").read_text(),
        "spec_algorithms": enum_members(srt / "speculative/spec_info.py", "SpeculativeAlgorithm"),
        "ngram_topk_is_max_bfs_breadth": "speculative_eagle_topk=cfg.speculative_ngram_max_bfs_breadth" in hook,
        "standalone_auto_params": 'if cfg.speculative_algorithm == "STANDALONE":\n        return (3, 1, 4)' in hook,
        "drafts_per_round_exclude_root": "draft_per_round = get_spec().speculative_num_draft_tokens - 1" in reporter,
        # the resolved CUDA-graph setting read back: cuda_graph_config {decode, prefill: {backend, ...}}
        "cuda_graph_config_fields": class_fields(srt / "model_executor/cuda_graph_config.py", "CudaGraphConfig"),
        "cuda_graph_phase_fields": class_fields(srt / "model_executor/cuda_graph_config.py", "PhaseConfig"),
        "resolved_dict_expands_records": "return {\n            field.name: _plain(getattr(value, field.name))"
        in (srt / "server_args.py").read_text(),
    }


if __name__ == "__main__":
    json.dump(main(), sys.stdout)
