"""Hugging Face TGI (huggingface/text-generation-inference): its launcher started (its container) or a
server attached; no in-process mode. It needs a CUDA GPU and runs nowhere here: every flag and request
field is checked against tables recorded from its source at each tag (upstream.json).

- adapter.py: the adapter class, its launch flags and requests (through huggingface_hub's client);
- settings.py: the version table (what each release reports), metric names, the pinned image, the
  launch-log lines its settings are read from;
- contract.py: the dry run's checks against upstream.json.
"""
from adapters.engines.tgi import contract
from adapters.engines.tgi.adapter import TGIServer
from adapters.engines.tgi.settings import IMAGE, TGI
from adapters.registry import EngineSpec, register

SPEC = EngineSpec(
    name="tgi",
    block_size=16,  # its paged attention's blocks; no option sets them
    # --num-shard: launcher/src/main.rs @ v3.3.7 (tensor-parallel shards; no pipeline or replica option)
    parallel={"tensor": "num_shard"},
    parallel_why="TGI shards tensors only (--num-shard); run replicas behind a router for data parallelism",
    image=IMAGE, container_opts="--shm-size 1g", container_cmd="--model-id /model --port 3000",
    script="text-generation-launcher", gpu=True, probe=("http://127.0.0.1:3000", "/info"),
    colour="tab:purple", metrics=TGI, reads=contract.READS, contract=contract.check,
)
register(SPEC, TGIServer)
