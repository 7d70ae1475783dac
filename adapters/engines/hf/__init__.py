"""The naive baseline: static batches through HF transformers' `model.generate()`, in a process of the
harness's own (adapter.py; stream.py turns generate()'s streamer into token events)."""
from adapters.engines.hf.adapter import HFEngine
from adapters.registry import EngineSpec, register

SPEC = EngineSpec(
    name="hf",
    default_mode="in_process",
    parallel_why="the HF baseline runs one process on one device",
    packages=("transformers",), install="pip install -e '.[hf]'",
    start="inferlab run experiments/configs/quickstart.toml",
    colour="tab:brown", baseline=True,
)
register(SPEC, HFEngine)
