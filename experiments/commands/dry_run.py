"""`inferlab run CONFIG --dry-run`: what each engine of the config would launch and send, checked
against upstream, before any GPU minute is billed. It starts no engine and needs no GPU.

For each engine it prints the exact launch command (container mounts, environment, port), the
version row it expects and how it reads the version back, the body of the first request on each
route the workload uses (and the start-up probe), the metrics it reads and the settings it reads
back with their sources; then every check (adapters/checks/dryrun.py, adapters/checks/contracts.py). Exit 0 only
when no check failed; else each failure is one line on stderr and the exit code is 2.

An engine the config launches without a `launcher` and that is not installed here is shown (and
checked) through its pinned image, as scripts/gpu_compare.sh would launch it.
"""
from __future__ import annotations

import json
import shlex
import sys
from typing import Any

from adapters import registry
from adapters.base import EngineUnavailable, GenerationRequest, SamplingConfig


def fallback_launcher(adapter: str) -> str | None:
    """The pinned image of the engine, launched as scripts/gpu_compare.sh's docker_launcher launches it (the model
    and work dir are mounted by the launcher itself, adapters/transport/launcher.py)."""
    spec = registry.spec(adapter)
    if spec is None or spec.image is None:
        return None
    opts = f"{spec.container_opts} " if spec.container_opts else ""
    return f"docker run --rm --gpus all --ipc host --network host {opts}{spec.image}"


def requests_of(cfg: Any, items: list[Any]) -> list[GenerationRequest]:
    """The workload's requests as the load generator sends them (experiments/running/load.py)."""
    sampling = cfg.sampling.model_dump()
    return [GenerationRequest(it.request_id, it.prompt_token_ids, SamplingConfig(**sampling, max_tokens=it.output_len),
                              messages=it.messages) for it in items]


def show(name: str, d: Any, out: Any) -> None:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"\n== {name} ({d.engine}, mode {d.mode})")
    if d.note:
        p(f"note: {d.note}")
    if d.launch is not None:
        p("launch: " + shlex.join(d.launch.argv))
        if d.launch.env:
            p("environment: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(d.launch.env.items())))
        p(f"port: {d.launch.port}; work dir: {d.launch.work_dir}; log: {d.launch.log_path}")
        if d.launch.stop_argv:
            p("stop: " + shlex.join(d.launch.stop_argv))
        for path, text in d.launch.files.items():
            p(f"file {path}:\n" + "\n".join("    " + ln for ln in text.rstrip().splitlines()))
    for line in d.version:
        p(f"version: {line}")
    for label, route, body in d.requests:
        p(f"request ({label}): POST {route} " + json.dumps(_elide(body)))
    for line in d.metrics:
        p(f"metrics: {line}")
    for line in d.settings:
        p(f"reads back: {line}")
    for c in d.checks:
        p("check " + c.line(d.engine))


def _elide(body: dict[str, Any]) -> dict[str, Any]:
    """Long token-id lists shortened for the screen (the count stays visible)."""
    out = {}
    for k, v in body.items():
        if isinstance(v, list) and len(v) > 12 and all(isinstance(x, int) for x in v):
            v = v[:8] + [f"... {len(v)} ids"]
        elif isinstance(v, str) and len(v) > 160:
            v = v[:120] + f"... ({len(v)} characters)"
        out[k] = _elide(v) if isinstance(v, dict) else v
    return out


def dry_run(cfg: Any, engines: dict[str, tuple[Any, dict, bool]], items: list[Any], out: Any = None) -> int:
    """Plan and check every engine; 0 when every check passed, else 2 (one line per failure on stderr)."""
    out = out or sys.stdout
    reqs = requests_of(cfg, items)
    failures: list[str] = []
    print(f"inferlab run --dry-run: {cfg.name}: {len(engines)} engine(s), model {cfg.model}, dtype {cfg.dtype}; "
          "nothing is started", file=out)
    for name, (engine, _, _) in engines.items():
        try:
            d = engine.dry_run(reqs, fallback_launcher(cfg.adapter(name)))
        except (EngineUnavailable, ValueError, RuntimeError, OSError) as e:
            failures.append(f"{name}: {e}".splitlines()[0])
            print(f"\n== {name}\ncheck FAIL: {failures[-1]}", file=out)
            continue
        show(name, d, out)
        failures += [c.line(name) for c in d.failed]
    print(f"\ndry run: {len(failures)} failed check(s)", file=out)
    for f in failures:
        print(f"inferlab: dry run: {f}", file=sys.stderr)
    return 2 if failures else 0
