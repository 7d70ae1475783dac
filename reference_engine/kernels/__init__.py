"""Kernels below the attention backends and fused ops, named by what they are written in:
`triton_paged_attention.py` (Triton GPU kernels; importing it needs `triton`, done only when the
Triton backend is chosen, see `reference_engine.triton_attention`), and C++ CPU kernels built on
first use by `cpu_build.py`: `cpp_attention.py` (paged decode attention; used by the backend
`reference_engine/cpu_attention.py`) and `cpp_fused_ops.py` (RMSNorm, rotary, SiLU-and-multiply;
used by `reference_engine/cpu_ops.py`).

Owns: kernel sources and their compilation. Never touches: requests, scheduling, KV blocks,
the model's modules or configs; it sees tensors and integers only. See docs/architecture.md."""
