"""TGI's dry-run checks, against the tables recorded from its source at each tag (upstream.json, each
citing file@tag; how each was read: tests/adapters/fixtures/tgi/SOURCE.md): the launcher's flags and
the environment it reads, the fields of POST / (CompatGenerateRequest, GenerateParameters), and the
version string the tag's server reports (TGI v3.3.7 was built from a Cargo.toml saying 3.3.6-dev0)."""
from __future__ import annotations

from typing import Any

from adapters.checks.contracts import found
from adapters.checks.dryrun import Check, DryRun, check_fields, check_flags, facts
from adapters.common.versions import image_tag_version

READS = ("GET /info: version, sha, max_total_tokens", "GET /metrics tgi_batch_max_total_tokens (KV capacity)",
         "the launch log: the launcher's Args print (dtype as requested), prefix caching, speculation, "
         "KV-cache blocks, CUDA graph sizes, 'Setting max batch total tokens'")


def check(adapter: Any, d: DryRun) -> None:
    VERSIONS = adapter.VERSIONS
    f = facts("tgi")
    tag = adapter.image_tag() if adapter.server is not None else None
    release = tag or image_tag_version(["", adapter.spec.image])
    said = f["tags"].get(f"v{release}", {}).get("reports")
    cargo = f"Cargo.toml@v{release}"
    d.version = [f"row {VERSIONS.known()}; {found(adapter, 'tgi') if tag else 'no image tag: the pin ' + release}; "
                 f"the v{release} server reports {said!r} ({cargo})",
                 "read back: GET /info version (and sha); an image tag is trusted over it"]
    try:
        VERSIONS.row(said, tag)
    except Exception as e:  # noqa: BLE001 - a refusal is the finding
        d.checks.append(Check(False, f"version {said!r} of v{release}", cargo, str(e)))
    flags = f["launcher_flags"].get(f"v{release}") or f["launcher_flags"]["v3.3.7"]
    if d.launch is not None:
        d.checks += check_flags(d.launch.server_args, flags["options"], 0, flags["source"])
        env = {**d.launch.env, **dict(a.split("=", 1) for a, b in zip(d.launch.argv[1:], d.launch.argv)
                                      if b == "-e" and "=" in a)}
        if "PREFIX_CACHING" in env:  # the one switch of a uniform feature; PROMETHEUS_PORT may go unread
            said_env = f["launcher_env_not_flags"]["PREFIX_CACHING"].get(f"v{release}", "")
            ok = not said_env.startswith("not read")
            d.checks.append(Check(ok, f"environment PREFIX_CACHING={env['PREFIX_CACHING']}", f"v{release} source",
                                  "" if ok else said_env))
    model = f["requests"]["POST / (compat_generate)"].get(f"v{release}") or \
        f["requests"]["POST / (compat_generate)"]["v3.3.7"]
    for label, route, body in d.requests:
        d.checks += check_fields("POST / (CompatGenerateRequest)", body, model["request_fields"], model["source"],
                                 model["deny_unknown_fields"])
        d.checks += check_fields("POST / parameters (GenerateParameters)", body.get("parameters") or {},
                                 model["parameters_fields"], model["source"], model["deny_unknown_fields"])
