"""Attention over the paged KV cache: one interface, a PyTorch reference and two fast backends.

- `interface.py`: `AttentionMetadata` (one step's slot mapping, block tables, lengths; built by
  the runner's `input_batch.py` once per step) and `AttentionBackend` (write this step's K/V into
  their slots, attend each query token to its context).
- `torch_backend.py`: the reference, SDPA over gathered blocks; runs anywhere.
- `cpu_backend.py`: the C++ kernels (`kernels/ops.py`: decode, prefill, prefill_amx, kv_write) reading
  K/V in place through the block table.
- `triton_backend.py` + `triton_kernels.py`: the GPU kernels.
- `registry.py`: backends by name, and the default for a device.

Owns: how attention reads and writes the KV tensors it is handed. Never touches: requests, the
scheduler, the block pool or prefix cache (it sees block ids as integers in tensors), nor the
model's other layers. See docs/architecture.md.
"""
from reference_engine.attention.interface import AttentionBackend, AttentionMetadata
from reference_engine.attention.registry import get_backend, default_attention_backend
from reference_engine.attention.torch_backend import CUDA_SDPA, TorchBackend

__all__ = ["AttentionBackend", "AttentionMetadata", "CUDA_SDPA", "TorchBackend",
           "default_attention_backend", "get_backend"]
