// Draft-model matmul with int8 weights AND int8 activations: y = x @ w.T for up to 16 rows.
//
// For the draft only: its precision changes how often the target agrees, never what the target
// outputs. Rebuilding float weights costs ~3 vector instructions per 8 weights on this CPU, and the
// draft is bound by that arithmetic, not by memory. Here each activation row is quantized once per
// call to int8 with one scale per 32 values, and 32 products at a time go through the integer
// multiply-add instructions (sign/maddubs/madd: ~5 instructions per 32 weights), leaving one float
// FMA per 32 weights to apply the activation block's scale.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <vector>

#include "avx2_math.h"

namespace {

constexpr int QB = 32;  // activation values per scale

// Symmetric int8 with one scale per 32 values (absmax / 127).
void quantize_rows(const float* x, int64_t M, int64_t in, int8_t* xq, float* sx) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < in / QB; ++b) {
      const float* v = x + m * in + b * QB;
      float amax = 0.0f;
      for (int i = 0; i < QB; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float scale = amax / 127.0f;
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      sx[m * (in / QB) + b] = scale;
      for (int i = 0; i < QB; ++i) xq[m * in + b * QB + i] = (int8_t)std::lrintf(v[i] * inv);
    }
  }
}

// Sum over one 32-value block of w[i] * x[i] as 8 int32 lanes: |w| (unsigned) times x with w's sign,
// pairwise into int16 (|w|, |x| <= 127, so no saturation), then pairwise into int32.
inline __m256i dot32(__m256i w_abs, __m256i w, __m256i x) {
  const __m256i pairs = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

template <int R, int MB>
inline void tile(const int8_t* xq, const float* sx, int64_t in, const int8_t* w, const float* scale, float* y, int64_t O) {
  const int64_t nb = in / QB;
  __m256 acc[R][MB];
  for (int r = 0; r < R; ++r) for (int j = 0; j < MB; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wv[R], wa[R];
    for (int r = 0; r < R; ++r) {
      _mm_prefetch((const char*)(w + r * in + (b + 8) * QB), _MM_HINT_T0);
      wv[r] = _mm256_loadu_si256((const __m256i*)(w + r * in + b * QB));
      wa[r] = _mm256_abs_epi8(wv[r]);
    }
    for (int j = 0; j < MB; ++j) {
      const __m256i xv = _mm256_loadu_si256((const __m256i*)(xq + j * in + b * QB));
      const __m256 s = _mm256_set1_ps(sx[j * nb + b]);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(wa[r], wv[r], xv)), s, acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) for (int j = 0; j < MB; ++j) y[j * O + r] = hsum(acc[r][j]) * scale[r];
}

template <int R>
inline void rows(const int8_t* xq, const float* sx, int64_t M, int64_t in, const int8_t* w, const float* scale, float* y, int64_t O) {
  const int64_t nb = in / QB;
  int64_t m = 0;
  for (; m + 2 <= M; m += 2) tile<R, 2>(xq + m * in, sx + m * nb, in, w, scale, y + m * O, O);
  if (m < M) tile<R, 1>(xq + m * in, sx + m * nb, in, w, scale, y + m * O, O);
}

}  // namespace

torch::Tensor int8_dot_linear_cpu(torch::Tensor x, torch::Tensor w, torch::Tensor scale) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "int8_dot_linear: x must be float32 on the CPU");
  TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 2 && w.is_contiguous(), "int8_dot_linear: weight must be a contiguous int8 matrix");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == w.size(0),
              "int8_dot_linear: one float32 scale per weight row");
  auto xc = x.contiguous();
  const int64_t in = xc.size(-1), M = xc.numel() / in, O = w.size(0);
  TORCH_CHECK(in == w.size(1) && in % QB == 0, "int8_dot_linear: inner size must match and be a multiple of 32");
  // Reused per calling thread: no allocation per draft step.
  static thread_local std::vector<int8_t> xq;
  static thread_local std::vector<float> sx;
  xq.resize(M * in);
  sx.resize(M * (in / QB));
  quantize_rows(xc.data_ptr<float>(), M, in, xq.data(), sx.data());
  // Pointers, not the thread_local names: inside the parallel region those would name each worker's own.
  const int8_t* xqp = xq.data();
  const float* sxp = sx.data();
  auto out_sizes = xc.sizes().vec();
  out_sizes.back() = O;
  auto y = torch::empty(out_sizes, xc.options());
  float* yp = y.data_ptr<float>();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  constexpr int R = 3;  // 3 rows x 2 tokens keeps accumulators, weights and |weights| in the 16 registers
  const int64_t tiles = (O + R - 1) / R;
  at::parallel_for(0, tiles, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t * R;
      if (o + R <= O) rows<R>(xqp, sxp, M, in, wp + o * in, sp + o, yp + o, O);
      else for (; o < O; ++o) rows<1>(xqp, sxp, M, in, wp + o * in, sp + o, yp + o, O);
    }
  });
  return y;
}
