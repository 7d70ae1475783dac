"""What `inferlab run CONFIG --dry-run` (experiments/commands/dry_run.py) shows and checks for one engine,
before any GPU minute is billed: the launch command (mounts, environment, port), the version row
it expects and how it reads the version back, the first request body on each route, the metrics
and settings it will read; and the checks of all that against upstream.

A check is against the engine's own code wherever it imports here (vLLM's parser and request
models in .venv-vllm, SGLang's in .venv-sglang: adapters/engines/<engine>/upstream_check.py), else
against the tables recorded from upstream's source at the pinned tag (adapters/engines/<engine>/upstream.json,
each table with its file@tag). A check that cannot run here says so and does not fail the dry run;
a failing one is one line naming the engine, the flag or field, and the upstream source.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import select
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENGINES = Path(__file__).resolve().parents[1] / "engines"  # adapters/engines/<engine>/: upstream.json, upstream_check.py
REPO = Path(__file__).resolve().parents[2]


@dataclass
class LaunchPlan:
    """A launch decided but not started (`ManagedServer.plan`)."""
    argv: list[str]
    env: dict[str, str]  # on top of the harness's environment (a container's is inside argv, as -e)
    files: dict[str, str]  # path -> text the adapter writes before the start (an options file)
    work_dir: Path
    log_path: Path
    port: int
    stop_argv: list[str] | None
    server_args: list[str]  # the engine's own arguments (after the program, module or image)
    missing: str | None = None  # a dry run's planned program that is not installed here (why)


@dataclass
class Check:
    ok: bool | None  # None: could not be checked on this machine (said, not failed)
    what: str  # "flag --backend tensorrt", "field detokenize on /v1/chat/completions"
    source: str  # the upstream file@tag, or the engine's own code that judged it
    why: str = ""

    def line(self, engine: str) -> str:
        mark = {True: "ok", False: "FAIL", None: "not checked"}[self.ok]
        return f"{mark}: {engine}: {self.what}" + (f": {self.why}" if self.why else "") + f" ({self.source})"


@dataclass
class DryRun:
    engine: str
    mode: str
    launch: LaunchPlan | None = None
    note: str = ""  # e.g. not installed here: shown with the pinned image
    version: list[str] = field(default_factory=list)
    requests: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (label, route, body)
    metrics: list[str] = field(default_factory=list)
    settings: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]


@functools.cache
def facts(engine: str) -> dict[str, Any]:
    """The recorded upstream tables of `engine` (adapters/engines/<engine>/upstream.json)."""
    return json.loads((ENGINES / engine / "upstream.json").read_text())


def short(source: str) -> str:
    """A table's citation up to its first parenthesis: 'file @ tag-or-commit'."""
    return source.split(" (")[0].strip()


def check_flags(args: list[str], options: dict[str, dict[str, Any]], positional: int, source: str) -> list[Check]:
    """Every `--flag` of `args` must be an option of the recorded table; one that takes a value
    must have one (and one of its choices, where the table lists them); at most `positional`
    bare arguments."""
    out, bare, i = [], 0, 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-"):
            bare += 1
            if bare > positional:
                out.append(Check(False, f"argument {a!r}", source, "not an option and no positional argument is left"))
            i += 1
            continue
        flag, _, inline = a.partition("=")
        spec = options.get(flag)
        if spec is None:
            out.append(Check(False, f"flag {flag}", source, "the pinned release has no such option"))
            i += 1
            continue
        if spec.get("value"):
            value = inline or (args[i + 1] if i + 1 < len(args) else None)
            i += 1 if inline else 2
            if value is None:
                out.append(Check(False, f"flag {flag}", source, "needs a value"))
            elif spec.get("choices") and value not in spec["choices"]:
                out.append(Check(False, f"flag {flag} {value}", source, f"not one of {', '.join(spec['choices'])}"))
        else:
            i += 1
    return out or [Check(True, f"{len(args)} launch arguments against the recorded flag table", source)]


def check_fields(where: str, body: dict[str, Any], fields: list[str], source: str, forbid: bool) -> list[Check]:
    """The keys of `body` against a request model's recorded fields: an unknown one is HTTP 400
    where the model forbids extras, and silently dropped elsewhere (a fairness break either way)."""
    unknown = sorted(set(body) - set(fields))
    if not unknown:
        return [Check(True, f"{len(body)} fields of {where}", source)]
    why = "the request model forbids unknown fields: HTTP 400 on every request" if forbid else \
        "the server would ignore it silently"
    return [Check(False, f"field {k} on {where}", source, why) for k in unknown]


def check_mounts(plan: LaunchPlan, container: bool) -> list[Check]:
    """Every file the adapter writes must be visible inside a container at the path the command
    line names (the launcher mounts the work dir; adapters/transport/launcher.py `mounted`)."""
    if not container or not plan.files:
        return []
    return [Check(mounted(plan.argv, path), f"file {path} inside the container", "adapters/transport/launcher.py",
                  "" if mounted(plan.argv, path) else "written on the host but not mounted: the server cannot open it")
            for path in plan.files]


def venv_python(launcher_python: str | None, package: str, venv: str) -> str | None:
    """An interpreter where `package` imports: the launcher's own, else the repo's contract venv."""
    for py in (launcher_python, str(REPO / venv / "bin" / "python")):
        if py and Path(py).exists() and subprocess.run(
                [py, "-c", f"import importlib.util as u, sys; sys.exit(u.find_spec({package!r}) is None)"],
                capture_output=True, timeout=60).returncode == 0:
            return py
    return None


CHECK_TIMEOUT_S = 300
REPLY = "@@inferlab-check@@"  # the checkers' reply marker (a log line on their stdout is not a reply)
_checkers: dict[tuple[str, str | Path], tuple[subprocess.Popen, Any]] = {}  # (python, script) -> (process, its stderr)


def run_checker(python: str, script: str | Path, payload: dict[str, Any]) -> dict[str, Any]:
    """Run `script` (an engine folder's upstream_check.py) in `python` (the engine's venv) on `payload`. One checker
    process per (python, script) answers every payload of this process, one JSON line each: importing
    vLLM or SGLang takes ~8 s, the check itself milliseconds."""
    key = (python, script)
    if key not in _checkers or _checkers[key][0].poll() is not None:
        err = tempfile.TemporaryFile()  # a pipe nobody reads would fill with import warnings and block it
        _checkers[key] = (subprocess.Popen([python, str(script)], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=err, text=True, cwd=REPO), err)
        if len(_checkers) == 1:
            atexit.register(_close_checkers)
    proc, err = _checkers[key]
    try:
        proc.stdin.write(json.dumps(payload) + "\n")
        proc.stdin.flush()
        deadline, buf = time.monotonic() + CHECK_TIMEOUT_S, b""
        fd = proc.stdout.fileno()  # read raw: a buffered reader could hold the reply while select waits
        while select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break  # it exited
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith(REPLY) and buf.endswith(b"\n"):
                    return json.loads(line[len(REPLY):])
    except BrokenPipeError:
        pass  # it exited before reading
    proc.kill()
    proc.wait()
    del _checkers[key]
    err.seek(0)
    tail = err.read().decode(errors="replace").strip().splitlines()[-1:]
    raise RuntimeError(f"{Path(script).name} failed in {python} (or gave no answer within {CHECK_TIMEOUT_S} s): {tail}")


def _close_checkers() -> None:
    for proc, _ in _checkers.values():
        proc.stdin.close()  # end of input: the checker's loop ends
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    _checkers.clear()


def own_code_checks(engine: str, python: str | None, script: str | Path, args: list[str],
                    bodies: list[tuple[str, str, dict[str, Any]]], extra: dict[str, Any] | None = None) -> list[Check]:
    """The launch arguments and bodies judged by the engine's own parser and request models."""
    if python is None:
        return [Check(None, "launch arguments and request bodies", f"{engine}'s own code",
                      f"{engine} does not import on this machine (make {engine})")]
    rep = run_checker(python, script, {"argv": args, "bodies": [[r, b] for _, r, b in bodies], **(extra or {})})
    who = f"{engine} {rep['version']}'s own parser ({python})"
    a = rep["argv"]
    out = [Check(a["ok"], f"{len(args)} launch arguments", who, a.get("error", "").strip().splitlines()[-1]
                 if not a["ok"] else "")]
    out += [Check(False, "deprecated flag", who, d) for d in a.get("deprecated", [])]
    for (label, route, _), res in zip(bodies, rep["bodies"]):
        src = f"{engine} {rep['version']}'s {res.get('model', 'request model')}"
        if res.get("unknown"):
            out += [Check(False, f"field {k} on {route}", src, "not a field of the request model") for k in res["unknown"]]
        elif not res["ok"]:
            out.append(Check(False, f"{label} body on {route}", src, str(res.get("error"))))
        else:
            out.append(Check(True, f"{label} body on {route}", src))
    return out


def metric_lines(names: Any) -> list[str]:
    """A MetricNames row as 'path: fact name, ...' lines (adapters/transport/metric_names.py)."""
    from dataclasses import fields as dc_fields

    parts = []
    for f in dc_fields(names):
        v = getattr(names, f.name)
        if f.name in ("engine", "path") or not v:
            continue
        parts.append(f"{f.name}={'|'.join(v) if isinstance(v, tuple) else v}")
    return [f"GET {names.path}: " + ", ".join(parts)]


def mounted(prefix: list[str], path: str) -> bool:
    """Whether a container command line already makes host `path` visible at the same path
    inside (`-v SRC:DST`, `--volume`, `--mount type=bind,source=..,target=..` of it or a parent)."""
    want = Path(path)
    for i, a in enumerate(prefix):
        spec = prefix[i + 1] if a in ("-v", "--volume", "--mount") and i + 1 < len(prefix) else \
            a.split("=", 1)[1] if a.startswith(("--volume=", "--mount=")) else None
        if spec is None:
            continue
        if "source=" in spec or "src=" in spec:  # --mount type=bind,source=A,target=B
            kv = dict(p.split("=", 1) for p in spec.split(",") if "=" in p)
            src, dst = kv.get("source") or kv.get("src"), kv.get("target") or kv.get("destination") or kv.get("dst")
        else:
            src, _, rest = spec.partition(":")
            dst = rest.split(":")[0]
        if src and src == dst and (want == Path(src) or Path(src) in want.parents):
            return True
    return False
