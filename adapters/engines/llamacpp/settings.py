"""What the llama.cpp adapter knows of llama.cpp b11312 (commit 0c1e57098, vendored by llama-cpp-python 0.3.36,
built by `make llamacpp`): where the binary is, its version line, its metric names, the startup-log lines
its settings are read back from, and its own `--help`, which the dry run checks a launch against.

Sources, all in that source tree (~/.cache/inferlab/llamacpp/src-0.3.36, tools/server/ unless named):
README.md (flags, /completion, /props, metrics), server-task.cpp (the /completion JSON, `stop_type`, the
metric names and types), server-schema.cpp (request fields), server-context.cpp (/props).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from adapters.common.readback import ReadBack
from adapters.transport.metric_names import MetricNames

REPO = Path(__file__).resolve().parents[3]
BUILD, COMMIT = 11312, "0c1e57098"  # scripts/setup_llamacpp.sh pins both
IMAGE = f"ghcr.io/ggml-org/llama.cpp:server-cuda-b{BUILD}"  # the same release, as its CUDA server image (a GPU host)
VERSION = re.compile(r"build (\d+), commit ([0-9a-f]+)\)")  # `llama-server --version`: "version: 0.5.0-dev (build 11312, commit 0c1e57098)"
KV_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}  # -ctk/-ctv for the weights' dtype

# llama.cpp's own Prometheus names (server-task.cpp, server_task_result_metrics::to_json -> /metrics): counters
# and gauges, no latency histograms and no KV gauge (its KV is a fixed context per slot).
LLAMACPP = MetricNames(
    engine="llamacpp",
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    prompt_tokens=("llamacpp:prompt_tokens_total",),
    generation_tokens=("llamacpp:tokens_predicted_total",),
    spec_drafts=("llamacpp:spec_decode_num_drafts_total",),
    spec_draft_tokens=("llamacpp:spec_decode_num_draft_tokens_total",),
    spec_accepted_tokens=("llamacpp:spec_decode_num_accepted_tokens_total",),
)


def binary() -> str | None:
    """The llama-server to launch: $LLAMACPP_SERVER (a user's own build), else the one `make llamacpp` built,
    else `llama-server` on PATH; None when there is none."""
    own = os.environ.get("LLAMACPP_SERVER")
    if own:
        return own
    built = REPO / ".llamacpp" / "bin" / "llama-server"
    return str(built) if built.is_file() else shutil.which("llama-server")


def locate() -> tuple[str | None, str | None]:
    """(where, version) of the llama-server found (inferlab list-engines), or (None, None)."""
    path = binary()
    found = version(path) if path else None
    return (path, f"b{found[0]} ({found[1]})" if found else None) if path else (None, None)


@lru_cache(maxsize=8)
def _run(path: str, flag: str) -> str:
    try:
        out = subprocess.run([path, flag], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run {path} {flag}: {e}"
    return out.stdout + out.stderr


def version(path: str) -> tuple[int, str] | None:
    """(build number, commit) from `llama-server --version`, or None."""
    m = VERSION.search(_run(path, "--version"))
    return (int(m.group(1)), m.group(2)) if m else None


def help_text(path: str) -> str:
    return _run(path, "--help")


# --- the dry run: flags and values against the binary's own --help -------------------------------------
# "-ctk,  --cache-type-k TYPE     KV cache data type for K": the names end at a run of spaces not after a comma
# (a row whose names fill the column, "-kvu,  --kv-unified, -no-kvu, --no-kv-unified", has its text below)
_ROW = re.compile(r"^(-\S.*?[^,\s])(?:\s{2,}(\S.*))?$")
_ALLOWED = re.compile(r"allowed values:\s*([\w.,\s-]+?)\s*(?:\(|$)")
_CHOICE = re.compile(r"\[([a-z]+(?:\|[a-z]+)+)\]")


def parse_help(text: str) -> dict[str, dict]:
    """flag -> {"value": the metavar or None, "choices": allowed values or None, "row": the flag's help line}.
    Continuation lines (the description wraps) are folded into the row above them."""
    flags: dict[str, dict] = {}
    last: list[str] = []
    for line in text.splitlines():
        m = _ROW.match(line.rstrip()) if line.startswith("-") and not line.startswith("---") else None
        if m is None:
            for f in last:  # a wrapped description, e.g. "allowed values: f32, f16, ..."
                flags[f]["row"] += " " + line.strip()
            continue
        names_part, desc = m.group(1), m.group(2) or ""
        names = [n.strip() for n in names_part.split(",")]
        value = None
        heads = []
        for n in names:
            head, _, meta = n.partition(" ")
            heads.append(head)
            value = value or (meta.strip() or None)
        last = heads
        for h in heads:
            flags[h] = {"value": value, "row": desc}
    for f in flags.values():
        allowed = _ALLOWED.search(f["row"])
        choice = _CHOICE.search(f["value"] or "")
        f["choices"] = ([v.strip() for v in allowed.group(1).split(",") if v.strip()] if allowed else
                        choice.group(1).split("|") if choice else None)
    return flags


def check_args(args: list[str], flags: dict[str, dict]) -> list[tuple[bool, str, str]]:
    """(ok, what, why) per flag of a llama-server command line, judged by the binary's --help."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-"):
            out.append((False, f"argument {a!r}", "not a flag, and no flag before it takes a value"))
            i += 1
            continue
        known = flags.get(a)
        if known is None:
            out.append((False, f"flag {a}", "llama-server --help has no such flag"))
            i += 1
            continue
        takes = known["value"] is not None and not known["value"].startswith("[")
        optional = known["value"] is not None and known["value"].startswith("[")
        if takes or (optional and i + 1 < len(args) and not args[i + 1].startswith("-")):
            v = args[i + 1] if i + 1 < len(args) else None
            out.append(_value(a, v, known))
            i += 2
        else:
            out.append((True, f"flag {a}", ""))
            i += 1
    return out


def _value(flag: str, v: str | None, known: dict) -> tuple[bool, str, str]:
    if v is None:
        return False, f"flag {flag}", f"takes a value ({known['value']}), none given"
    if known["choices"] and v not in known["choices"]:
        return False, f"flag {flag} {v}", f"allowed values: {', '.join(known['choices'])}"
    if known["value"] == "N" and not re.fullmatch(r"-?\d+", v):
        return False, f"flag {flag} {v}", "takes an integer (N)"
    return True, f"flag {flag} {v}", ""


# --- read back: the startup log (at -lv 4, "trace": the llama_context and KV lines are below the default 3) ----------------------------------------------------------------------
MiB = 2**20
LOG = {  # key -> (pattern, how to turn the match into the value)
    "threads": (re.compile(r"system_info: n_threads = (\d+)"), int),
    "threads_batch": (re.compile(r"system_info: n_threads = \d+ \(n_threads_batch = (\d+)\)"), int),
    "n_ctx": (re.compile(r"llama_context: n_ctx\s+= (\d+)"), int),
    "n_ctx_seq": (re.compile(r"llama_context: n_ctx_seq\s+= (\d+)"), int),
    "n_seq_max": (re.compile(r"llama_context: n_seq_max\s+= (\d+)"), int),
    "n_batch": (re.compile(r"llama_context: n_batch\s+= (\d+)"), int),
    "n_ubatch": (re.compile(r"llama_context: n_ubatch\s+= (\d+)"), int),
    "flash_attn": (re.compile(r"llama_context: flash_attn\s+= (\w+)"), str),
    "kv_unified": (re.compile(r"llama_context: kv_unified\s+= (\w+)"), lambda s: s == "true"),
    "kv_cache_dtype": (re.compile(r"llama_kv_cache: size = .*?K \((\w+)\)"), str),
}
MEMORY = {  # memory key -> pattern of a "... = X MiB" line (rounded to 0.01 MiB)
    "weights": re.compile(r"load_tensors:\s+CPU(?:_Mapped)? model buffer size =\s+([\d.]+) MiB"),
    "kv_allocated": re.compile(r"llama_kv_cache: size =\s+([\d.]+) MiB"),
    "compute_buffer": re.compile(r"CPU compute buffer size =\s+([\d.]+) MiB"),
}


def log_read_back(rb: ReadBack, log: str, where: str) -> None:
    for key, (pat, conv) in LOG.items():
        m = pat.search(log)
        rb.put(key, conv(m.group(1)) if m else None, where)
    for key, pat in MEMORY.items():
        m = pat.search(log)
        if m:
            rb.mem(key, int(float(m.group(1)) * MiB), f"{where} (MiB, 2 decimals)")
