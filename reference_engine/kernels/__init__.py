"""C++ CPU kernels for the element-wise stages (`cpp_fused_ops.py`: RMSNorm, rotary,
SiLU-and-multiply; used by `reference_engine/model/fused_ops.py`) and the build step every C++ kernel
shares (`cpu_build.py`: compiled on first use, cached in ~/.cache/inferlab/kernels). The
attention kernels live beside their backends in `reference_engine/attention/`.

Owns: kernel sources and their compilation. Never touches: requests, scheduling, KV blocks,
the model's modules or configs; it sees tensors and integers only. See docs/architecture.md."""
