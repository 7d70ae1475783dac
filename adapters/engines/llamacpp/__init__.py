"""llama.cpp (ggml-org/llama.cpp): its `llama-server`, built from the source llama-cpp-python 0.3.36 vendors
(`make llamacpp`: release b11312, commit 0c1e57098), a user's own binary (LLAMACPP_SERVER) or its server
image; launched or attached. The CPU engine people run, measured here for real.

- adapter.py: the adapter class, its launch flags (every setting explicit), /completion with token ids;
- settings.py: the binary, its version line, metric names, the startup-log lines read back, and its
  own --help parsed for the dry run;
- weights.py: the engine directory as GGUF, converted by llama.cpp's own converter (cached);
- contract.py: the dry run's checks against the built binary's --help.
"""
from adapters.engines.llamacpp import contract
from adapters.engines.llamacpp.adapter import LlamaCppServer
from adapters.engines.llamacpp.settings import IMAGE, LLAMACPP, locate
from adapters.registry import EngineSpec, register

SPEC = EngineSpec(
    name="llamacpp",
    # no paged blocks: each slot holds a contiguous context of max_model_len tokens (-c N x L --no-kv-unified)
    parallel={},
    parallel_why="llama-server runs one model copy per process on CPU here (its -sm/-ts split layers across GPUs)",
    image=IMAGE, container_opts="", container_cmd="",
    script="llama-server", locate=locate, probe=("http://127.0.0.1:8080", "/props"),
    install="make llamacpp", start="inferlab run experiments/configs/cpu_vs_llamacpp.toml", colour="tab:brown", metrics=LLAMACPP, reads=contract.READS, contract=contract.check,
)
register(SPEC, LlamaCppServer)
