"""The C++ CPU kernels: their sources in `csrc/` (.cpp and .h files, one shared header `common.h`), built
into one extension by `cpu_build.py` (at `make setup` or on first use, cached in
~/.cache/inferlab/kernels), and a Python module per kernel that documents its layout and rounding:
`cpp_gemm.py` (every linear, on one layout), `cpp_fused_ops.py` (RMSNorm, rotary, SiLU-and-multiply),
`cpp_decode_layer.py` (one decoder layer). The attention kernels' modules live beside their backend in
`reference_engine/attention/` (their sources are csrc/attention*).

Owns: kernel sources and their compilation. Never touches: requests, scheduling, KV blocks,
the model's modules or configs; it sees tensors and integers only. See docs/architecture.md."""
