"""Any OpenAI-compatible server someone else started, by its URL: the OpenAI protocol client of
adapters/transport/openai.py, registered as an engine of its own. Its metric names are guessed from
the server's Prometheus text (vLLM's names, or any engine's table whose histograms appear there)."""
from adapters.registry import EngineSpec, register
from adapters.transport.openai import OpenAIEngine

SPEC = EngineSpec(
    name="openai",
    default_mode="attach",
    parallel_why="an attached server's parallelism was fixed when it started",
    probe=("http://127.0.0.1:8000", "/v1/models"),
    install='inferlab serve models/tiny --port 8000   (then url = "http://127.0.0.1:8000/v1")',
    attach_only=True, colour="tab:pink",
)
register(SPEC, OpenAIEngine)
