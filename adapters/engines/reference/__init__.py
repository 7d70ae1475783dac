"""The reference engine (this repository's reference_engine/): `AsyncEngine` in this interpreter, or
`inferlab serve` launched or attached.

- adapter.py: the in-process adapter, the knobs both modes take, the check that a config can run here;
- server.py: the adapter of `inferlab serve` (OpenAI routes, vLLM's metric names and /server_info shape).
Its launch and bodies are this checkout's own, tested by tests/reference_engine/server: no upstream contract.
"""
from adapters.engines.reference.adapter import ReferenceInProcess
from adapters.engines.reference.server import REFERENCE, ReferenceServer
from adapters.registry import EngineSpec, register

SPEC = EngineSpec(
    name="reference",
    default_mode="in_process",
    block_option="block_size", block_size=16,
    # reference_engine/distributed/ (tensor); reference_engine/engine/data_parallel.py (data: server mode, N cores
    # behind one `inferlab serve`, each pinned to its own CPUs, routed by the option `router`)
    parallel={"tensor": "tensor_parallel_size", "data": "data_parallel_size"},
    parallel_why="the reference engine does tensor and data parallelism, no pipeline parallelism",
    packages=("inferlab",), probe=("http://127.0.0.1:8000", "/v1/models"),
    install="pip install -e .", start="inferlab serve models/tiny --port 8000",
    colour="tab:blue", anchor=True, simulated=True, metrics=REFERENCE,
)
register(SPEC, ReferenceServer, ReferenceInProcess)
