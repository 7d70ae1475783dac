"""TensorRT-LLM (NVIDIA/TensorRT-LLM): `trtllm-serve` launched (its release container) or attached, or
its LLM API in this interpreter. It needs a CUDA GPU and runs nowhere here: every flag, options-file key
and request field is checked against tables recorded from its source at the pinned tag (upstream.json).

- adapter.py: the two adapter classes (server, in-process), the options file, its metric names and
  version table;
- contract.py: the dry run's checks against upstream.json.
"""
from adapters.engines.trtllm import contract
from adapters.engines.trtllm.adapter import IMAGE, TRTLLM, TRTLLMInProcess, TRTLLMServer
from adapters.registry import EngineSpec, register

SPEC = EngineSpec(
    name="trtllm",
    block_size=32,  # tokens_per_block's default; the adapter sets no option for it
    # --tp_size / --pp_size: tensorrt_llm/commands/serve.py @ 00209af149e7774406881a37283dce303571eb11 (aliases of
    # --tensor_parallel_size / --pipeline_parallel_size)
    parallel={"tensor": "tp_size", "pipeline": "pp_size"},
    parallel_why="trtllm-serve has no data-parallel option (run replicas behind a router)",
    image=IMAGE, container_opts="--ulimit memlock=-1 --ulimit stack=67108864",
    container_cmd="trtllm-serve /model --port 8000",
    packages=("tensorrt_llm",), script="trtllm-serve", gpu=True, probe=("http://127.0.0.1:8000", "/version"),
    colour="tab:red", metrics=TRTLLM, reads=contract.READS, contract=contract.check,
)
register(SPEC, TRTLLMServer, TRTLLMInProcess)
