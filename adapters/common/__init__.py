"""What every adapter shares beyond transport: the uniform feature options (features.py), the
[parallel] block as each engine's flags (parallel.py), settings read back (readback.py), version
tables (versions.py), model shapes for KV sizing (model_shape.py), the runtime's share of memory
(runtime_base.py)."""
