"""The model and its weights: `llama` (the Llama/Qwen-family decoder, layers and `CausalLM`), `loader`
(safetensors -> parameters), `gguf` (GGUF -> HF directory), `make` (random-weight models from presets),
CPU linear layers (`packed_linear`), fused element-wise ops (`fused_ops`) and the all-decode fast path
(`fused_decode`, one C++ call per layer).

Owns: parameters and their layouts, the forward pass. Never touches: scheduling, requests, sampling.
"""
