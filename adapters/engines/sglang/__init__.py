"""SGLang (sgl-project/sglang): its server (`python -m sglang.launch_server`) launched or attached, or
`sglang.Engine` in this interpreter. It needs a CUDA GPU; here its own Python code (.venv-sglang, no GPU
parts) checks every flag and body the adapter sends.

- adapter.py: the two adapter classes (server, in-process), its flags and request bodies;
- settings.py: the version table (flags and metric names per release), the pinned image, the
  feature flags and what /server_info reports back;
- contract.py: the dry run's checks through SGLang's own parser (upstream_check.py runs in .venv-sglang).
"""
from adapters.engines.sglang import contract
from adapters.engines.sglang.adapter import SGLangInProcess, SGLangServer
from adapters.engines.sglang.settings import IMAGE, SGLANG
from adapters.registry import EngineSpec, register

SPEC = EngineSpec(
    name="sglang",
    block_option="page_size", block_size=1,  # SGLang's page_size defaults to 1
    # --tp-size / --pp-size / --dp-size: sglang/srt/server_args.py, SGLang 0.5.23 (parsed by its own parser:
    # tests/adapters/sglang_contract.py)
    parallel={"tensor": "tp_size", "pipeline": "pp_size", "data": "dp_size"},
    image=IMAGE, container_opts="--shm-size 16g",
    container_cmd="python3 -m sglang.launch_server --model-path /model --port 30000",
    packages=("sglang",), venv=".venv-sglang", venv_serves=False, gpu=True,
    probe=("http://127.0.0.1:30000", "/server_info"),
    colour="tab:green", metrics=SGLANG, reads=contract.READS, contract=contract.check,
)
register(SPEC, SGLangServer, SGLangInProcess)
