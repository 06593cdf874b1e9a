// Every function the extension exports, declared once: bindings.cpp binds them to Python, and a kernel that
// calls another (the int8 layer calls the attention and the int8 products) includes this instead of its own copy.
// Only ATen's tensor type is needed here: torch/extension.h (pybind11, autograd, the C++ frontend) took ~35 s to
// parse in every file that included it, most of a first build; now only bindings.cpp includes pybind11's headers.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

// skinny_linear.cpp
at::Tensor skinny_linear_cpu(at::Tensor x, at::Tensor w);
// block_attention.cpp
at::Tensor block_attention_cpu(at::Tensor q, at::Tensor k, at::Tensor v, int64_t start,
                                  std::optional<at::Tensor> visible, double scale, int64_t window,
                                  bool definition = false);
// gguf_linear.cpp
at::Tensor gguf_linear_cpu(at::Tensor x, std::vector<at::Tensor> parts, std::vector<int64_t> types);
std::vector<int64_t> gguf_block_types();
// quant_dot.cpp
void quant_linear_into(const at::Tensor& x, const std::vector<at::Tensor>& parts, const std::vector<int64_t>& types,
                       std::string isa, int64_t perturb_row, at::Tensor& y);
int64_t out_rows_of_parts(const std::vector<at::Tensor>& parts);
at::Tensor quant_linear_cpu(at::Tensor x, std::vector<at::Tensor> parts, std::vector<int64_t> types,
                               std::string isa, int64_t perturb_row);
std::vector<int64_t> quant_block_types();
std::string quant_isa();
std::vector<std::string> quant_isa_paths();
at::Tensor quantize_q8_0_cpu(at::Tensor w);
at::Tensor repack_q4k_cpu(at::Tensor blocks);
at::Tensor interleave_k_cpu(at::Tensor blocks, int64_t type, bool to_x16, bool field_walk = false);
// int8_layer.cpp
at::Tensor int8_attn_in(at::Tensor x, at::Tensor norm, double eps, std::vector<at::Tensor> qkv_parts,
                           std::vector<int64_t> qkv_types, std::optional<at::Tensor> bias,
                           std::optional<at::Tensor> q_norm, std::optional<at::Tensor> k_norm, at::Tensor cos,
                           at::Tensor sin, int64_t heads, int64_t kv_heads, int64_t head_dim, std::string isa);
at::Tensor int8_attn_out(at::Tensor x, at::Tensor attn, std::vector<at::Tensor> out_parts,
                            std::vector<int64_t> out_types, at::Tensor norm, double eps,
                            std::vector<at::Tensor> gate_up_parts, std::vector<int64_t> gate_up_types,
                            std::vector<at::Tensor> down_parts, std::vector<int64_t> down_types, std::string isa,
                            std::optional<at::Tensor> post_attn_norm, std::optional<at::Tensor> post_mlp_norm,
                            int64_t activation);
at::Tensor int8_layer(at::Tensor x, at::Tensor attn_norm, double eps, std::vector<at::Tensor> qkv_parts,
                         std::vector<int64_t> qkv_types, std::optional<at::Tensor> bias,
                         std::optional<at::Tensor> q_norm, std::optional<at::Tensor> k_norm, at::Tensor cos,
                         at::Tensor sin, int64_t heads, int64_t kv_heads, int64_t head_dim, std::vector<at::Tensor> keys,
                         std::vector<at::Tensor> values, std::vector<int64_t> starts, std::vector<int64_t> rows,
                         std::vector<at::Tensor> visible, std::vector<at::Tensor> out_parts,
                         std::vector<int64_t> out_types, at::Tensor mlp_norm, std::vector<at::Tensor> gate_up_parts,
                         std::vector<int64_t> gate_up_types, std::vector<at::Tensor> down_parts,
                         std::vector<int64_t> down_types, std::string isa, std::optional<at::Tensor> post_attn_norm,
                         std::optional<at::Tensor> post_mlp_norm, int64_t activation, double scale,
                         int64_t window);
