"""Runs in .venv-sglang (scripts/setup_sglang_venv.sh), not in the harness: checks a launch command
against SGLang's own argument parser (`ServerArgs.add_cli_args`) and request bodies against its own
request code: `POST /generate` keys against the `GenerateReqInput` fields (managers/io_struct.py,
read without importing it: it pulls CUDA-only modules), its `sampling_params` by constructing SGLang's
`SamplingParams` (keyword-only: an unknown key is a TypeError), then `normalize` and `verify`; the
OpenAI routes against `sglang.srt.entrypoints.openai.protocol`. tests/adapters/sglang_contract.py
uses the same helpers.

stdin, one request per line: {"argv": [server args], "bodies": [[route, body], ...], "vocab_size": N};
stdout, one line per request after REPLY: {"version", "argv": {"ok", "error", "deprecated"}, "bodies":
[{"ok", "unknown", "error"}]}.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import json
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

REPLY = "@@inferlab-check@@"  # adapters/dryrun.run_checker reads the lines that start with it

def package() -> Path:
    return Path(importlib.util.find_spec("sglang").submodule_search_locations[0])


def stub_triton() -> None:
    """Triton (a GPU compiler, not installed) replaced by SGLang's own import stub, the one it
    installs on platforms without Triton (sglang/_platform_stubs.py), loaded by file path so that
    sglang's package __init__ does not run first."""
    spec = importlib.util.spec_from_file_location("_sglang_platform_stubs", package() / "_platform_stubs.py")
    stubs = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = stubs
    spec.loader.exec_module(stubs)
    if importlib.util.find_spec("triton") is None:
        sys.meta_path.insert(0, stubs._TritonFinder())
        stubs._make_mock("triton").__version__ = "0.0.0-stub"


def class_fields(path: Path, cls: str) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    return []


class ByteTokenizer:
    """Enough tokenizer for SamplingParams.normalize (it encodes stop strings to size them)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode())


def parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(p)
    return p


def parse_argv(p: argparse.ArgumentParser, argv: list[str], keys: list[str] = ()) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            ns = p.parse_args(argv)
    except SystemExit:
        return {"ok": False, "error": err.getvalue()[-2000:]}
    said = out.getvalue() + err.getvalue()
    return {"ok": True, "namespace": {k: getattr(ns, k, "<missing>") for k in keys},
            "deprecated": [ln for ln in said.splitlines() if "deprecat" in ln.lower()]}


def sampling(sp: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    from sglang.srt.sampling.sampling_params import SamplingParams

    try:
        p = SamplingParams(**sp)
        p.normalize(ByteTokenizer())
        p.verify(vocab_size)
    except Exception as e:  # noqa: BLE001 - reported to the caller
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"ok": True}


def validate(route: str, body: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    if route == "/generate":
        fields = class_fields(package() / "srt/managers/io_struct.py", "GenerateReqInput")
        unknown = sorted(set(body) - set(fields))
        res = sampling(body.get("sampling_params") or {}, vocab_size)
        return {**res, "ok": res["ok"] and not unknown, "unknown": unknown, "model": "GenerateReqInput"}
    from sglang.srt.entrypoints.openai import protocol

    model = {"/v1/completions": protocol.CompletionRequest,
             "/v1/chat/completions": protocol.ChatCompletionRequest}.get(route)
    if model is None:
        return {"ok": False, "error": f"no SGLang request model for route {route}"}
    try:
        r = model.model_validate(body)
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
    extra = sorted((r.model_extra or {}).keys())
    return {"ok": not extra, "unknown": extra, "model": model.__name__}


def main() -> None:
    stub_triton()
    for line in sys.stdin:  # one request per line; SGLang is imported once for all of them
        req = json.loads(line)
        vocab = int(req.get("vocab_size") or 1 << 20)
        out = {"version": version("sglang"), "argv": parse_argv(parser(), req["argv"]),
               "bodies": [validate(route, body, vocab) for route, body in req.get("bodies", [])]}
        print(REPLY, json.dumps(out), flush=True)  # the marker: a log line on stdout is not a reply


if __name__ == "__main__":
    main()
