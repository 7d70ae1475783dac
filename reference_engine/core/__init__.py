"""Scheduling and KV-block bookkeeping: the engine's core state, with no KV or model tensors in it (a
request holds only its own sampling generator and its draft's probabilities).

Owns: request state (`request.py`), the scheduler (`scheduler.py`: token budget, admission,
chunked prefill, preemption, committing each step) and, built and held by the scheduler, the
KV-cache manager (`kv_cache_manager.py`) over the block pool (`block_pool.py`) and the prefix
cache (`prefix_cache.py`). It hands the runner one plain record per step (`scheduler_output.py`).
Never touches: tensors, the model, the device, attention backends or tokenizers; the runner sizes
and allocates the KV tensors (`reference_engine/worker/kv_cache.py`) and only reads block tables.
See docs/architecture.md.
"""
