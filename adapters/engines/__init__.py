"""One folder per engine. Each holds its adapter, its version table, flags and metric names, its
upstream check or recorded facts, and one `EngineSpec`, registered in its `__init__.py` with one line
(adapters/registry.py finds every folder here; no list names them). A folder imports no other
engine's folder: what several engines share is in adapters/transport/ and adapters/common/."""
