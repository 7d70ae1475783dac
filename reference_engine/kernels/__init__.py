"""Kernels below the attention backends and fused ops: Triton GPU paged attention
(`paged_attention.py`; importing it needs `triton`, done only when the Triton backend is chosen,
see `reference_engine.triton_attention`) and C++ CPU kernels built on first use (`cpu_build.py`,
`cpu_attention.py`, `cpu_ops.py`: sources and loaders; the modules that use them are
`reference_engine/cpu_attention.py` and `reference_engine/cpu_ops.py`).

Owns: kernel sources and their compilation. Never touches: requests, scheduling, KV blocks,
the model's modules or configs; it sees tensors and integers only. See docs/architecture.md."""
