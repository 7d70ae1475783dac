// The one Python extension: every kernel, built from csrc/*.cpp by kernels/cpu_build.py.
// pybind11 and torch's casters for at::Tensor (torch/csrc/utils/pybind.h), not <torch/extension.h>: all of
// torch's C++ API made this file 28 of a 62-s build's CPU seconds, for each of the three ISA builds (now 11)
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace inferlab;
  m.def("linear", &linear, "y = x @ W.T (+ bias) for any row count on W's 32-column panels (linear.cpp)");
  m.def("linear_bf16", &linear_bf16, "the same on bf16 pair panels; path 2 AMX, 1 vdpbf16ps, 0 FMAs, the best here up to it (linear_bf16.cpp)");
  m.def("panel_rows", &panel_rows, "W[ids] from W's panels, exact (linear.cpp)");
  m.def("linear_silu", &linear_silu, "silu(gate) * up from the stacked gate_up panels on AMX (linear_bf16.cpp)");
  m.def("bf16_native", &bf16_native, "does this build on this CPU run vdpbf16ps? (linear_bf16.cpp)");
  m.def("amx_ready", &amx_ready, "does the bf16 GEMM run on AMX here? (linear_amx.cpp)");
  m.def("rms_norm", &rms_norm, "RMSNorm, HF's order (fused_ops.cpp)");
  m.def("add_rms_norm", &add_rms_norm, "sum = x + a, then RMSNorm of it (fused_ops.cpp)");
  m.def("silu_mul", &silu_mul, "silu(gate) * up (fused_ops.cpp)");
  m.def("rope_", &rope_, "rotary embedding in place (fused_ops.cpp)");
  m.def("decode", &decode, "paged attention, one query per sequence (attention_decode.cpp)");
  m.def("prefill", &prefill, "paged causal attention over query chunks (attention_prefill.cpp)");
  m.def("prefill_amx", &prefill_amx, "prefill for bf16 on AMX tiles, P in bf16 (attention_amx.cpp)");
  m.def("kv_write", &kv_write, "the step's keys and values into the paged cache (kv_write.cpp)");
  m.def("decode_layer", &decode_layer, "one decoder layer for an all-decode batch (decode_layer.cpp)");
}
