"""The engine's front ends: offline (`llm_engine.LLMEngine`, `LLM`), async (`async_engine.AsyncEngine`),
the engine core in its own process (`engine_process` the front end's side, `engine_core` the child's loop),
turning step outputs into request outputs (`output_processor`), and the teaching trace (`trace`).

Owns: request intake and validation, the step loop, streaming outputs, the core's life cycle.
Never touches: tensors (the worker's), KV blocks (core/'s scheduler and KV-cache manager).
"""
