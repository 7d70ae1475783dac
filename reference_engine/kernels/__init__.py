"""The C++ CPU kernels: their sources in `csrc/` (.cpp and .h files: `common.h` what every kernel shares,
`simd.h` the vector lanes, `amx.h` the AMX tile configuration, `kernels.h` the entry points), built into
one extension by `cpu_build.py` (at `make setup` or on first use, cached in ~/.cache/inferlab/kernels);
`ops.py`, the one Python surface: a typed wrapper per entry point and `available()`; `cpp_gemm.py`, the
panels every linear layer's weight is held in, and which bf16 path a product takes.

Owns: kernel sources and their compilation. Never touches: requests, scheduling, KV blocks,
the model's modules or configs; it sees tensors and integers only. See docs/architecture.md."""
