"""What a dry run (adapters/checks/dryrun.py) adds beyond the launch, for every server adapter:
the start-up requests, the first body on each route (built by the adapter's own code), the metrics
it reads, and then the engine's own contract checks, which live in its folder and are named by its
spec (`EngineSpec.contract`, e.g. adapters/engines/vllm/contract.py: its launch flags through vLLM's
own parser, its bodies through vLLM's request models; `EngineSpec.reads`: the settings it reads back).
An engine without a contract is this checkout's own server, tested by its own tests.
"""
from __future__ import annotations

from typing import Any

from adapters.checks.dryrun import Check, DryRun, check_mounts, metric_lines
from adapters.common.versions import image_tag_version, launcher_version

DEFAULT_READS = ("GET /v1/models, the first /metrics scrape",)


def startup_requests(adapter: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """Requests an adapter sends at start, before the workload (OpenAI servers: the probe)."""
    if hasattr(adapter, "probe_body"):
        if adapter.served_model_name is None:  # the server lists the model under its path by default
            adapter.served_model_name = adapter.server.model_arg if adapter.server else "(GET /v1/models)"
        return [("start-up probe", "/v1/completions", adapter.probe_body())]
    return []


def check(adapter: Any, d: DryRun) -> None:
    """Fill in `d`'s version, metrics and settings lines and the engine's own checks (its spec's contract)."""
    names = getattr(adapter, "METRICS", None)
    d.metrics = metric_lines(names) if names is not None else []
    spec = adapter.spec
    d.settings = list(spec.reads if spec is not None and spec.reads else DEFAULT_READS)
    (spec.contract if spec is not None and spec.contract else own)(adapter, d)


def first_per_route(adapter: Any, requests: list[Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, route, body) of the first request the workload sends on each route, built by the
    adapter's own body code (what `generate()` sends)."""
    out, seen = [], set()
    for r in requests:
        route, body = adapter.request_body(r)
        if route not in seen:
            seen.add(route)
            out.append((f"first {route} request ({r.request_id})", route, body))
    return out


def plan_launched(adapter: Any, requests: list[Any], fallback_launcher: str | None) -> DryRun:
    """A server adapter's dry run: its launch (or the pinned image's, where the engine is not
    installed here and the config names no launcher), bodies, version, metrics, settings, and the
    engine's contract checks (adapters/checks/contracts.py)."""
    d = DryRun(adapter.name, adapter.mode)
    if adapter.server is None:
        d.note = f"attached to {adapter.url}: nothing is launched; its flags were fixed when it started"
    else:
        d.launch = adapter.launch_plan(installed=False)
        if d.launch.missing and not adapter.options.get("launcher") and fallback_launcher:
            d.note = f"{d.launch.missing}: shown with the pinned image, as scripts/gpu_compare.sh launches it"
            d.launch = adapter.launch_plan(installed=False, launcher=fallback_launcher)
        elif d.launch.missing:
            d.note = d.launch.missing
        d.checks += check_mounts(d.launch, adapter.server.launcher.is_container)
    d.requests = startup_requests(adapter) + first_per_route(adapter, requests)
    check(adapter, d)
    return d


def own(adapter: Any, d: DryRun) -> None:
    """This checkout's own server: nothing upstream to check it against."""
    d.version = ["this checkout's engine (GET /version)"]
    d.checks.append(Check(None, "launch and bodies", "inferlab's own server", "tested by tests/reference_engine/server"))


def launcher_python(adapter: Any) -> str | None:
    launcher = adapter.server.launcher if adapter.server is not None else None
    return launcher.prefix[0] if launcher is not None and not launcher.is_container else None


def found(adapter: Any, dist: str) -> str:
    launcher = adapter.server.launcher if adapter.server is not None else None
    if launcher is None:
        return "attached: the server's own report decides"
    if launcher.is_container:
        return f"image tag {image_tag_version(launcher.prefix)} ({launcher.prefix[-1]})"
    version = next((v for d in (dist, f"{dist}-cpu") if (v := launcher_version(launcher, d))), None)
    return f"{dist} {version or 'not installed'} for {launcher.prefix[0]}"


