"""The worker: what runs one scheduled step on a device. `model_runner` (inputs -> model -> logits ->
sampler), `input_batch` (flatten a step into varlen tensors, slot mapping, block tables), `sampler`,
`cuda_graphs`, `gpu_memory` (sizing the KV cache from device memory), `step_record` (the scheduler's
decision for one step, as the runner and tensor-parallel ranks read it).

Owns: device tensors of a step, the KV cache tensors, CUDA graphs. Never touches: scheduling, which
blocks a request holds (it reads the block tables it is given), HTTP.
"""
