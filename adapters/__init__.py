"""One interface to every engine (docs/architecture.md):

- base.py: the `Engine` interface and the request and event types;
- registry.py: the engines by name, each an `EngineSpec` and its adapter classes, found in
- engines/<name>/: one folder per engine;
- transport/: HTTP, SSE, Prometheus, server launch, the OpenAI protocol client;
- checks/: the dry run and the contract checks against upstream;
- common/: what adapters share beyond transport (features, parallel flags, read-back, versions).
"""
