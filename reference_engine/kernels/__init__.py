"""Triton GPU kernels. Importing a submodule needs the `triton` package; nothing here is
imported by the engine unless a Triton backend is chosen (see `reference_engine.triton_attention`)."""
