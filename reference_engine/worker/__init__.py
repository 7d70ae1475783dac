"""The worker: what runs one scheduled step on a device. `model_runner` (inputs -> model -> logits ->
sampler), `input_batch` (flatten a step into varlen tensors, slot mapping, block tables), `sampler`,
`cuda_graphs`, `memory_plan` (what start-up puts in memory, checked against what is free: the one object the
memory split, `/server_info` and the RAM check read), `kv_cache` (the KV tensors), `device_memory` (free RAM,
CUDA and NVML readings), `cpu_heap` (the CPU process's heap policy, RSS, huge pages), `backends`, `paths`,
`step_record` (the scheduler's decision for one step, as the runner and tensor-parallel ranks read it).

Owns: device tensors of a step, the KV cache tensors, CUDA graphs. Never touches: scheduling, which
blocks a request holds (it reads the block tables it is given), HTTP.
"""
