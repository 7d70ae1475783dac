"""Tensor parallelism over `torch.distributed`: one process per rank, Megatron-style sharded layers.

This package owns the process group (`group.py`: starting the worker ranks, the per-step broadcast
of the scheduler's plain record, the all-reduce group with its timeout, the watchdog that turns a
dead rank into a clear error), the worker loop of ranks > 0 (`worker.py`), which weights each rank
holds (`sharding.py`: heads, KV heads and MLP columns per rank, the slices the loader reads from
safetensors) and the row-parallel layer that all-reduces (`layers.py`); `torchrun.py` starts the
same ranks under torchrun. It never touches scheduling, the KV-cache manager or block tables (rank 0's
runner forwards the scheduler's record as it got it), sampling (only rank 0 samples, from
replicated logits), or tokenization. Nothing here imports another module at package import time.
"""
