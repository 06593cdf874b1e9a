// Small-batch matmul y = x @ w.T for CPU decoding; see kernels/__init__.py for why it exists.
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "avx2_math.h"
#include "kernels.h"

// Weight storage: float32 or bfloat16.
enum WType { F32 = 0, BF16 = 1 };
template <int WT> constexpr int64_t wsize() { return WT == F32 ? 4 : 2; }

template <int WT>
static inline __m256 loadw(const char* w, int64_t i) {
  if (WT == BF16) {
    __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)w + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_loadu_ps((const float*)w + i);
}

// R weight rows x MB activation rows per tile; every (row, token) dot product is summed in the
// same order whatever M is, so a verify block reproduces single-token logits bit for bit.
template <int R, int MB, int WT>
static inline void tile(const float* x, int64_t in, const char* w, int64_t wstride, float* out, int64_t O) {
  __m256 acc[R][MB];
  for (int r = 0; r < R; ++r) for (int j = 0; j < MB; ++j) acc[r][j] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t i = 0; i < in; i += 8) {
    __m256 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) { _mm_prefetch(w + r * wstride + (i + 128) * wsize<WT>(), _MM_HINT_T0); wv[r] = loadw<WT>(w + r * wstride, i); }
#pragma GCC unroll 8
    for (int j = 0; j < MB; ++j) {
      __m256 xv = _mm256_loadu_ps(x + j * in + i);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][j] = _mm256_fmadd_ps(xv, wv[r], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) for (int j = 0; j < MB; ++j) out[j * O + r] = hsum(acc[r][j]);
}

template <int R, int WT>
static inline void rows(const float* x, int64_t M, int64_t in, const char* w, int64_t wstride, float* y, int64_t O) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<R, 4, WT>(x + m * in, in, w, wstride, y + m * O, O);
  switch (M - m) {
    case 3: tile<R, 3, WT>(x + m * in, in, w, wstride, y + m * O, O); break;
    case 2: tile<R, 2, WT>(x + m * in, in, w, wstride, y + m * O, O); break;
    case 1: tile<R, 1, WT>(x + m * in, in, w, wstride, y + m * O, O); break;
    default: break;
  }
}

template <int WT>
static void run(const float* x, int64_t M, int64_t in, const void* w, int64_t O, float* y) {
  const int64_t wstride = in * wsize<WT>();
  constexpr int R = 3;
  const int64_t tiles = (O + R - 1) / R;
  at::parallel_for(0, tiles, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t * R;
      const char* wrow = (const char*)w + o * wstride;
      if (o + R <= O) rows<R, WT>(x, M, in, wrow, wstride, y + o, O);
      else for (; o < O; ++o, wrow += wstride) rows<1, WT>(x, M, in, wrow, wstride, y + o, O);
    }
  });
}

at::Tensor skinny_linear_cpu(at::Tensor x, at::Tensor w) {
  TORCH_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16, "skinny_linear: weight must be float32 or bfloat16");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "skinny_linear: x must be float32");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "skinny_linear: weight must be a contiguous matrix");
  TORCH_CHECK(x.size(-1) == w.size(1) && w.size(1) % 8 == 0, "skinny_linear: inner size must match and be a multiple of 8");
  auto xc = x.contiguous();
  int64_t in = xc.size(-1), M = xc.numel() / in, O = w.size(0);
  auto out_sizes = xc.sizes().vec(); out_sizes.back() = O;
  auto y = at::empty(out_sizes, xc.options());
  const float* xp = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (w.scalar_type() == at::kBFloat16) run<BF16>(xp, M, in, w.data_ptr(), O, yp);
  else run<F32>(xp, M, in, w.data_ptr(), O, yp);
  return y;
}
