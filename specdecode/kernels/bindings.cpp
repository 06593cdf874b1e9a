// The Python module: every kernel of kernels.h under its Python name. The one file that includes pybind11, so the
// kernels themselves compile against ATen alone. It takes only what the bindings use: pybind11 with torch's tensor
// conversion (torch/csrc/utils/pybind.h) and the standard containers (pybind11/stl.h). torch/python.h brings the
// whole C++ frontend besides, and doubled this file's compile, the second longest of a first build.
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("skinny_linear", &skinny_linear_cpu);
  m.def("block_attention", &block_attention_cpu, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("start"),
        pybind11::arg("visible"), pybind11::arg("scale"), pybind11::arg("window"), pybind11::arg("definition") = false);
  m.def("gguf_linear", &gguf_linear_cpu);
  m.def("gguf_block_types", &gguf_block_types);
  m.def("quant_linear", &quant_linear_cpu);
  m.def("quant_block_types", &quant_block_types);
  m.def("quant_isa", &quant_isa);
  m.def("quant_isa_paths", &quant_isa_paths);
  m.def("quantize_q8_0", &quantize_q8_0_cpu);
  m.def("repack_q4k", &repack_q4k_cpu);
  m.def("interleave_k", &interleave_k_cpu, pybind11::arg("blocks"), pybind11::arg("type"), pybind11::arg("to_x16"),
        pybind11::arg("field_walk") = false);
  m.def("int8_attn_in", &int8_attn_in);
  m.def("int8_attn_out", &int8_attn_out);
  m.def("int8_layer", &int8_layer);
}
