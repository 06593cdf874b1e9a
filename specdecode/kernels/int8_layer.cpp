// The int8 target's decoder layer in one call instead of ~40 PyTorch operations.
//
// A decode step of a 1.5B model spends little in any one of RMSNorm, bias, rotary embedding, SiLU, the
// residual adds or the cache writes, but 28 layers of them as separate PyTorch operations cost several
// milliseconds of dispatch per step, a sizeable share once the matmuls run at memory speed. Here they
// run as plain loops over each row:
//   attn_in:  h = rmsnorm(x) * w;  qkv = h @ Wqkv.T (+ bias);  (Qwen3: rmsnorm each q and k head);
//             rotate q and k                                                           -> [T, q+2kv]
//   layer:    attn_in; write k, v to the cache; attention (block_attention.cpp); attn_out
//   attn_out: x += attn @ Wo.T;  h = rmsnorm(x) * w;  x += (silu(gate) * up) @ Wdown.T  -> [T, hidden]
//             (Gemma: gelu_tanh for silu, and each of the two products normalized again before its add)
// Every operation reads one row and writes that row, in a fixed order, so a row's result is the
// same in a decode step, a verify block or a prompt of any length: speculative output stays exactly
// plain output.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "avx2_math.h"
#include "kernels.h"

namespace {

constexpr int64_t KERNEL_ROWS = 64;  // rows per quant_linear call (its MAX_M): a prompt chunk reuses each weight 64 times
constexpr int64_t ROWS_PER_TASK = 32;  // the row loops below run in parallel only for prompt-sized blocks (a verify
                                       // block's few rows cost less than waking the other threads)

// f(t) for every row t < T; in parallel where T is large (rows are independent, so the split changes nothing).
template <class F>
void for_rows(int64_t T, F&& f) {
  at::parallel_for(0, T, ROWS_PER_TASK, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) f(t);
  });
}

// x [T, in] -> [T, out], any T, in calls of at most KERNEL_ROWS rows (each row's result is its own).
at::Tensor linear_rows(const at::Tensor& x, const std::vector<at::Tensor>& parts, const std::vector<int64_t>& types,
                          const std::string& isa) {
  const int64_t T = x.size(0);
  auto y = at::empty({T, out_rows_of_parts(parts)}, x.options());
  for (int64_t i = 0; i < T; i += KERNEL_ROWS) {
    auto rows = y.narrow(0, i, std::min(KERNEL_ROWS, T - i));  // whole rows: contiguous
    quant_linear_into(x.narrow(0, i, rows.size(0)), parts, types, isa, -1, rows);
  }
  return y;
}

// out = x * (1 / sqrt(mean(x^2) + eps)) * w over n values (n % 8 == 0; out may be x); the sum of squares in
// 8 lanes, then a fixed hsum.
void rms_norm_row(const float* x, int64_t n, const float* w, float eps, float* out) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  const __m256 r = _mm256_set1_ps(1.0f / std::sqrt(hsum(acc) / (float)n + eps));
  for (int64_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), r), _mm256_loadu_ps(w + i)));
}

void rms_norm_rows(const float* x, int64_t T, int64_t n, const float* w, float eps, float* out) {
  for_rows(T, [&](int64_t t) { rms_norm_row(x + t * n, n, w, eps, out + t * n); });
}

// A norm weight of n floats, or nullptr where the model has none.
const float* optional_weight(const c10::optional<at::Tensor>& w, int64_t n, const char* what) {
  if (!w || !w->defined()) return nullptr;
  TORCH_CHECK(w->scalar_type() == at::kFloat && w->is_contiguous() && w->numel() == n, what, ": ", n, " contiguous float32 expected");
  return w->data_ptr<float>();
}

// Half-rotation rotary embedding of `heads` heads of size D in place: (a, b) -> (a cos - b sin, b cos + a sin).
void rope_heads(float* v, int64_t heads, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* a = v + h * D;
    float* b = a + half;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = a[i], x2 = b[i];
      a[i] = x1 * cos[i] - x2 * sin[i];
      b[i] = x2 * cos[i] + x1 * sin[i];
    }
  }
}

// Both gate activations are g * sigmoid(a(g)): silu with a(g) = g, and the tanh-approximated GELU with
// a(g) = 2 sqrt(2/pi) (g + 0.044715 g^3), since 0.5 (1 + tanh(y)) = sigmoid(2y).
enum Activation : int64_t { SILU = 0, GELU_TANH = 1 };
constexpr float GELU_A = 1.5957691216057308f, GELU_B = 0.044715f * 1.5957691216057308f;

// act(g) * u over n values; the sigmoid's exponent kept non-positive on both sides of 0.
void gate_mul(const float* g, const float* u, int64_t n, Activation act, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    __m256 a = gv;
    if (act == GELU_TANH)  // g (A + B g^2)
      a = _mm256_mul_ps(gv, _mm256_fmadd_ps(_mm256_mul_ps(gv, gv), _mm256_set1_ps(GELU_B), _mm256_set1_ps(GELU_A)));
    const __m256 e = exp_nonpositive(_mm256_or_ps(a, sign));  // e^-|a|
    const __m256 positive = _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GE_OQ);
    const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(e, one, positive), _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) {
    const float a = act == GELU_TANH ? g[i] * std::fma(g[i] * g[i], GELU_B, GELU_A) : g[i];
    const float e = std::exp(-std::fabs(a));
    out[i] = g[i] * ((a >= 0.0f ? 1.0f : e) / (1.0f + e)) * u[i];
  }
}

void check_rows(const at::Tensor& x, int64_t n, const char* what) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous() && x.size(1) == n && n % 8 == 0, what,
              ": contiguous float32 [T, ", n, "] expected");
}

}  // namespace

// x [T, hidden]; cos/sin [T, D/2]; bias, q_norm and k_norm ([D], Qwen3) may be undefined. Returns qkv
// [T, (H + 2 Hkv) * D], q and k normalized per head where there are norms, then rotated.
at::Tensor int8_attn_in(at::Tensor x, at::Tensor norm, double eps, std::vector<at::Tensor> qkv_parts,
                           std::vector<int64_t> qkv_types, c10::optional<at::Tensor> bias,
                           c10::optional<at::Tensor> q_norm, c10::optional<at::Tensor> k_norm, at::Tensor cos,
                           at::Tensor sin, int64_t heads, int64_t kv_heads, int64_t head_dim, std::string isa) {
  const int64_t T = x.size(0), n = x.size(1);
  check_rows(x, n, "int8_attn_in");
  TORCH_CHECK(norm.numel() == n && cos.is_contiguous() && sin.is_contiguous() && cos.size(0) == T && cos.size(1) == head_dim / 2,
              "int8_attn_in: norm weight or rotary tables of the wrong shape");
  auto h = at::empty_like(x);
  rms_norm_rows(x.data_ptr<float>(), T, n, norm.data_ptr<float>(), (float)eps, h.data_ptr<float>());
  auto qkv = linear_rows(h, qkv_parts, qkv_types, isa);
  const int64_t width = (heads + 2 * kv_heads) * head_dim;
  TORCH_CHECK(qkv.size(1) == width, "int8_attn_in: the QKV matrix does not match the head counts");
  float* p = qkv.data_ptr<float>();
  const float* b = nullptr;
  if (bias && bias->defined()) {
    TORCH_CHECK(bias->numel() == width && bias->is_contiguous(), "int8_attn_in: bias of the wrong size");
    b = bias->data_ptr<float>();
  }
  const float* qn = optional_weight(q_norm, head_dim, "int8_attn_in: q_norm");
  const float* kn = optional_weight(k_norm, head_dim, "int8_attn_in: k_norm");
  TORCH_CHECK(!qn == !kn && (!qn || head_dim % 8 == 0), "int8_attn_in: q and k norms go together, on heads of a multiple of 8");
  for_rows(T, [&](int64_t t) {
    float* row = p + t * width;
    if (b)
      for (int64_t i = 0; i < width; ++i) row[i] += b[i];
    if (qn) {
      for (int64_t h = 0; h < heads; ++h) rms_norm_row(row + h * head_dim, head_dim, qn, (float)eps, row + h * head_dim);
      for (int64_t h = heads; h < heads + kv_heads; ++h) rms_norm_row(row + h * head_dim, head_dim, kn, (float)eps, row + h * head_dim);
    }
    const float* c = cos.data_ptr<float>() + t * head_dim / 2;
    const float* s = sin.data_ptr<float>() + t * head_dim / 2;
    rope_heads(p + t * width, heads + kv_heads, head_dim, c, s);  // q heads, then k heads, are adjacent
  });
  return qkv;
}

// x [T, hidden] (the layer input), attn [T, q_size]; post_attn_norm and post_mlp_norm ([hidden], Gemma) may be
// undefined; activation: an Activation. Returns the layer output.
at::Tensor int8_attn_out(at::Tensor x, at::Tensor attn, std::vector<at::Tensor> out_parts,
                            std::vector<int64_t> out_types, at::Tensor norm, double eps,
                            std::vector<at::Tensor> gate_up_parts, std::vector<int64_t> gate_up_types,
                            std::vector<at::Tensor> down_parts, std::vector<int64_t> down_types, std::string isa,
                            c10::optional<at::Tensor> post_attn_norm, c10::optional<at::Tensor> post_mlp_norm,
                            int64_t activation) {
  const int64_t T = x.size(0), n = x.size(1);
  check_rows(x, n, "int8_attn_out");
  TORCH_CHECK(norm.numel() == n, "int8_attn_out: norm weight of the wrong size");
  TORCH_CHECK(activation == SILU || activation == GELU_TANH, "int8_attn_out: unknown activation ", activation);
  const float* post_attn = optional_weight(post_attn_norm, n, "int8_attn_out: post_attn_norm");
  const float* post_mlp = optional_weight(post_mlp_norm, n, "int8_attn_out: post_mlp_norm");
  auto y = linear_rows(attn.contiguous(), out_parts, out_types, isa);  // attn @ Wo.T, row by row
  if (post_attn) rms_norm_rows(y.data_ptr<float>(), T, n, post_attn, (float)eps, y.data_ptr<float>());
  y.add_(x);
  auto h = at::empty_like(y);
  rms_norm_rows(y.data_ptr<float>(), T, n, norm.data_ptr<float>(), (float)eps, h.data_ptr<float>());
  auto gu = linear_rows(h, gate_up_parts, gate_up_types, isa);
  const int64_t inter = gu.size(1) / 2;
  auto act = at::empty({T, inter}, x.options());
  for_rows(T, [&](int64_t t) {
    gate_mul(gu.data_ptr<float>() + t * 2 * inter, gu.data_ptr<float>() + t * 2 * inter + inter, inter,
             (Activation)activation, act.data_ptr<float>() + t * inter);
  });
  auto out = linear_rows(act, down_parts, down_types, isa);
  if (post_mlp) rms_norm_rows(out.data_ptr<float>(), T, n, post_mlp, (float)eps, out.data_ptr<float>());
  return out.add_(y);
}

// A whole layer over the rows of one or more sequences, each at its own cache: x [T, hidden] holds, in order,
// rows[s] rows of sequence s at its cache positions starts[s].. (keys[s], values[s]: that sequence's cache
// for this layer, [kv_heads, max_len, head_dim] contiguous). The products run once over all T rows (each
// row's result is its own); each sequence's keys and values are written to its cache, then each of its rows
// attends that cache up to itself (or, for a token tree, visible[s] [rows, rows] as block_attention takes
// it; an empty tensor means causal; scale and window as block_attention takes them). A row's bits depend on its own inputs and position only, whichever
// other sequences share the pass: a batch is row-exact as a block is.
at::Tensor int8_layer(at::Tensor x, at::Tensor attn_norm, double eps, std::vector<at::Tensor> qkv_parts,
                         std::vector<int64_t> qkv_types, c10::optional<at::Tensor> bias,
                         c10::optional<at::Tensor> q_norm, c10::optional<at::Tensor> k_norm, at::Tensor cos,
                         at::Tensor sin, int64_t heads, int64_t kv_heads, int64_t head_dim, std::vector<at::Tensor> keys,
                         std::vector<at::Tensor> values, std::vector<int64_t> starts, std::vector<int64_t> rows,
                         std::vector<at::Tensor> visible, std::vector<at::Tensor> out_parts,
                         std::vector<int64_t> out_types, at::Tensor mlp_norm, std::vector<at::Tensor> gate_up_parts,
                         std::vector<int64_t> gate_up_types, std::vector<at::Tensor> down_parts,
                         std::vector<int64_t> down_types, std::string isa, c10::optional<at::Tensor> post_attn_norm,
                         c10::optional<at::Tensor> post_mlp_norm, int64_t activation, double scale, int64_t window) {
  const int64_t T = x.size(0), S = (int64_t)rows.size();
  TORCH_CHECK((int64_t)keys.size() == S && (int64_t)values.size() == S && (int64_t)starts.size() == S &&
                  (int64_t)visible.size() == S,
              "int8_layer: one cache, start, row count and visibility per sequence");
  int64_t total = 0;
  for (int64_t s = 0; s < S; ++s) {
    const auto& kc = keys[s];
    const auto& vc = values[s];
    TORCH_CHECK(kc.scalar_type() == at::kFloat && vc.scalar_type() == at::kFloat && kc.is_contiguous() && vc.is_contiguous() &&
                    kc.dim() == 3 && kc.sizes() == vc.sizes() && kc.size(0) == kv_heads && kc.size(2) == head_dim,
                "int8_layer: a cache must be contiguous float32 [kv_heads, max_len, head_dim]");
    TORCH_CHECK(rows[s] >= 1 && starts[s] >= 0 && starts[s] + rows[s] <= kc.size(1), "int8_layer: a block does not fit in its cache");
    total += rows[s];
  }
  TORCH_CHECK(total == T, "int8_layer: the sequences' rows do not add up to the block");
  auto qkv = int8_attn_in(x, attn_norm, eps, qkv_parts, qkv_types, bias, q_norm, k_norm, cos, sin, heads, kv_heads, head_dim, isa);
  const int64_t q_size = heads * head_dim, kv_size = kv_heads * head_dim, width = q_size + 2 * kv_size;
  const float* p = qkv.data_ptr<float>();
  auto attn = at::empty({T, q_size}, x.options());
  int64_t first = 0;  // the sequence's first row in the block
  for (int64_t s = 0; s < S; ++s) {
    const int64_t n = rows[s], start = starts[s], max_len = keys[s].size(1);
    float* kc = keys[s].data_ptr<float>();
    float* vc = values[s].data_ptr<float>();
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < kv_heads; ++h) {
        const float* row = p + (first + t) * width + q_size + h * head_dim;
        std::copy_n(row, head_dim, kc + (h * max_len + start + t) * head_dim);
        std::copy_n(row + kv_size, head_dim, vc + (h * max_len + start + t) * head_dim);
      }
    auto q = qkv.narrow(0, first, n).narrow(1, 0, q_size).reshape({n, heads, head_dim});
    c10::optional<at::Tensor> vis;
    if (visible[s].numel()) vis = visible[s];
    auto out = block_attention_cpu(q, keys[s].narrow(1, 0, start + n), values[s].narrow(1, 0, start + n), start, vis, scale, window);
    attn.narrow(0, first, n).copy_(out.view({n, q_size}));
    first += n;
  }
  return int8_attn_out(x, attn, out_parts, out_types, mlp_norm, eps, gate_up_parts, gate_up_types, down_parts, down_types, isa,
                       post_attn_norm, post_mlp_norm, activation);
}
